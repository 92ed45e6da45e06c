"""A session's turns: builds one `Turn` (gateway/speech/turn.py) per reply from the session's plain parts.

It keeps what lasts across a session's turns: the conversation history, the device's memory, the
session's tool sources, its voice, and the device's features. What one turn sends is in `Turn`.

Each turn first reads the device's agent (gateway/agents/active.py: ``agent``, bounded, the default agent
when the store cannot say) and applies it: the agent's role prompt, voice (when the agent's voice
changed: a voice the `change_voice` tool picked stays otherwise), speed and instruct text, its LLM
(one client per distinct endpoint, gateway/agents/llm_pool.py), its tools, its memory, its expressive
speech; the session applies the rest (idle timeouts, memory restore: ``on_agent``). So an edit, or a
new agent for the device, applies from its next turn. A device that must activate first (``ota.activation:
code``) hears how to instead of an answer, and no LLM is asked.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from gateway.agents.active import ActiveAgent
from gateway.agents.llm_pool import LLMPool
from gateway.agents.profile import AgentTools
from gateway.config import ToolsConfig
from gateway.llm.base import ChatLLM
from gateway.llm.conversation import Conversation
from gateway.llm.tool_calls import ToolCallingLLM
from gateway.metrics import GatewayMetrics
from gateway.service.usage import UsageMeter
from gateway.speech.phrases import Phrases
from gateway.speech.turn import Tools, Turn, TurnConfig, TurnRecorder
from gateway.speech.voice_choice import TurnVoice, VoiceChoice
from gateway.tools.base import ToolSource
from gateway.tools.toolset import ToolSet
from gateway.xiaozhi import Event
from tts_engine import SpeechEngine

log = logging.getLogger(__name__)

AgentSource = Callable[[], Awaitable[ActiveAgent]]  # the device's agent now (read per turn)
Remember = Callable[[str, str, ActiveAgent | None], None]  # save an exchange to the device's memory


def metrics_recorder(
    metrics: GatewayMetrics, *, latency: Callable[[float], None] | None = None
) -> TurnRecorder:
    """A turn's reports into the gateway's Prometheus metrics (and ``latency``: the device registry)."""

    def first_audio(seconds: float) -> None:
        metrics.observe_first_audio(seconds)
        if latency is not None:
            latency(seconds)

    return TurnRecorder(
        frame_sent=metrics.frames_sent.inc,
        sentence_failed=metrics.tts_errors.inc,
        llm_failed=metrics.llm_errors.inc,
        first_audio=first_audio,
        underruns=metrics.underruns.inc,
        tool_call=metrics.observe_tool_call,
    )


def usage_recorder(
    metrics: GatewayMetrics, usage: UsageMeter, device_id: str, *, latency: Callable[[float], None] | None = None
) -> TurnRecorder:
    """``metrics_recorder`` plus the device's usage per day (``device:<id>``, docs/service.md)."""

    def spoke(characters: int, audio_s: float, first_audio_s: float | None, failed: bool) -> None:
        usage.record_device_turn(device_id, characters=characters, audio_s=audio_s, first_audio_s=first_audio_s,
                                 failed=failed)  # fmt: skip

    return replace(metrics_recorder(metrics, latency=latency), spoke=spoke)


class Turns:
    def __init__(
        self,
        *,
        engine: SpeechEngine,
        llm: ChatLLM,
        send: Callable[[Event], Awaitable[None]],
        config: TurnConfig,
        conversation: Conversation,
        features: Callable[[], dict[str, Any]],
        tools: ToolsConfig | None = None,  # None: no tools offered
        tool_sources: Callable[[AgentTools | None], list[ToolSource]] | None = None,
        remember: Remember | None = None,
        recorder: TurnRecorder | None = None,
        on_turn: Callable[[str], None] | None = None,  # a turn of this kind starts (metrics)
        phrases: Phrases | None = None,  # the fixed phrases' stored audio (gateway/speech/phrases.py)
        voice: VoiceChoice | None = None,  # the session's voice (its one owner); None: the configured one
        agent: AgentSource | None = None,  # None: the config's agent, always
        llms: LLMPool | None = None,  # the agents' LLM clients (None: `llm` for every agent)
        on_agent: Callable[[ActiveAgent], Awaitable[None]] | None = None,  # the session applies its part
        expressive: dict[str, str] | None = None,  # agents.expressive_instructs
        greeting: str = "你好",  # without agents: the greeting (session.greeting)
    ) -> None:
        self._engine = engine
        self._llm = llm
        self._send = send
        self.config = config
        self._conversation = conversation
        self._features = features
        self._tools_config = tools
        self._tool_sources = tool_sources  # this turn's tool sources, in priority order
        self._remember = remember  # saves an exchange to the device's memory (never blocks)
        self._recorder = recorder
        self._on_turn = on_turn
        self._phrases = phrases
        self.voice = voice or VoiceChoice(config.voice)  # change_voice sets it for what follows
        self._agent_source = agent
        self._llms = llms
        self._on_agent = on_agent
        self._expressive = expressive or {}
        self._greeting = greeting
        self.agent: ActiveAgent | None = None  # the agent of the last turn
        self._agent_voice: str | None = config.voice  # the agent voice last applied to `voice`
        self.last: Turn | None = None  # the turn that ran last (or runs now)

    def new_turn(
        self,
        *,
        tools: Tools = None,
        started: float | None = None,
        llm: ChatLLM | None = None,
        agent: ActiveAgent | None = None,
    ) -> Turn:
        profile = agent.profile if agent is not None else None
        voice = TurnVoice(
            self.voice,
            speed=profile.speed if profile is not None else 1.0,
            instruct=profile.instruct if profile is not None else None,
        )
        self.last = Turn(
            engine=self._engine,
            llm=llm or self._llm,
            send=self._send,
            config=self.config,
            voice=voice,
            tools=tools,
            emotion=self._features().get("emoji", True) is not False,
            recorder=self._recorder,
            started=started,
            phrases=self._phrases,
            expressive=self._expressive if profile is not None and profile.expressive else None,
        )
        return self.last

    async def current_agent(self) -> ActiveAgent | None:
        """Reads the device's agent and applies it (None without agents)."""
        if self._agent_source is None:
            return None
        agent = await self._agent_source()
        self._apply(agent)
        if self._on_agent is not None:
            await self._on_agent(agent)
        self.agent = agent
        return agent

    def _apply(self, agent: ActiveAgent) -> None:
        profile = agent.profile
        self._conversation.system_prompt = profile.system_prompt()
        voice = profile.voice or None
        if voice != self._agent_voice:  # the agent's voice changed (a voice picked by a tool stays otherwise)
            self._agent_voice = voice
            offered = self._engine.voices
            if voice is not None and voice not in offered:
                log.warning("agent %s: voice %r is not offered (%s); the configured voice instead",
                            profile.name, voice, ", ".join(offered))  # fmt: skip
                voice = self.config.voice
            self.voice.change(voice)

    async def spoken(self, stt_text: str | None, texts: list[str], *, kind: str) -> None:
        """A turn with fixed sentences (notices)."""
        self._count(kind)
        agent = await self.current_agent() if kind != "notice" else self.agent
        await self.new_turn(agent=agent).say(texts, stt=stt_text)

    async def greeting(self) -> None:
        """The wake word's greeting: the agent's (how to activate, for a device that must)."""
        self._count("greeting")
        agent = await self.current_agent()
        text = self._greeting if agent is None else agent.activation or agent.profile.greeting
        await self.new_turn(agent=agent).say([text])

    async def query(self, text: str) -> None:
        """The user said or typed `text`: `stt`, then the LLM's streamed answer."""
        self._count("query")
        started = time.monotonic()
        agent = await self.current_agent()
        if agent is not None and agent.activation is not None:
            await self.new_turn(agent=agent, started=started).say([agent.activation], stt=text)
            return
        if agent is None or self._llms is None:
            await self._answer(text, self._llm, agent, started)
            return
        with self._llms.lease(agent.profile.llm) as llm:
            await self._answer(text, llm, agent, started)

    async def _answer(self, text: str, llm: ChatLLM, agent: ActiveAgent | None, started: float) -> None:
        policy = agent.profile.tools if agent is not None else None
        tools = functools.partial(self._tools, llm, policy)
        turn = self.new_turn(tools=tools, started=started, llm=llm, agent=agent)
        try:
            await turn.answer(text, self._conversation.messages_for(text))
        finally:
            answer = turn.answer_text
            if answer.strip():  # as far as it got when aborted
                self._conversation.add_turn(text, answer)
                if self._remember is not None and (agent is None or agent.memory):
                    self._remember(text, answer, agent)

    def _count(self, kind: str) -> None:
        if self._on_turn is not None:
            self._on_turn(kind)

    async def _tools(self, llm: ChatLLM, policy: AgentTools | None) -> ToolSet | None:
        """This turn's tools (none with `tools.enabled: false` or nothing offered)."""
        cfg = self._tools_config
        if cfg is None or not cfg.enabled or self._tool_sources is None:
            return None
        if not isinstance(llm, ToolCallingLLM):
            return None
        tools = await ToolSet.gather(
            self._tool_sources(policy),
            max_tools=cfg.max_tools,
            max_argument_chars=cfg.max_argument_chars,
            max_result_chars=cfg.max_result_chars,
        )
        return tools or None
