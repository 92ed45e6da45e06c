"""A session's turns: builds one `Turn` (gateway/speech/turn.py) per reply from the session's plain parts.

It keeps what lasts across a session's turns: the conversation history, the device's memory, the
session's tool sources, its voice, and the device's features. What one turn sends is in `Turn`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from gateway.config import ToolsConfig
from gateway.llm.base import ChatLLM
from gateway.llm.conversation import Conversation
from gateway.llm.tool_calls import ToolCallingLLM
from gateway.metrics import GatewayMetrics
from gateway.service.usage import UsageMeter
from gateway.speech.phrases import Phrases
from gateway.speech.turn import Tools, Turn, TurnConfig, TurnRecorder
from gateway.speech.voice_choice import VoiceChoice
from gateway.tools.base import ToolSource
from gateway.tools.toolset import ToolSet
from gateway.xiaozhi import Event
from tts_engine import SpeechEngine


def metrics_recorder(metrics: GatewayMetrics) -> TurnRecorder:
    """A turn's reports into the gateway's Prometheus metrics."""
    return TurnRecorder(
        frame_sent=metrics.frames_sent.inc,
        sentence_failed=metrics.tts_errors.inc,
        llm_failed=metrics.llm_errors.inc,
        first_audio=metrics.observe_first_audio,
        underruns=metrics.underruns.inc,
        tool_call=metrics.observe_tool_call,
    )


def usage_recorder(metrics: GatewayMetrics, usage: UsageMeter, device_id: str) -> TurnRecorder:
    """``metrics_recorder`` plus the device's usage per day (``device:<id>``, docs/service.md)."""

    def spoke(characters: int, audio_s: float, first_audio_s: float | None, failed: bool) -> None:
        usage.record_device_turn(device_id, characters=characters, audio_s=audio_s, first_audio_s=first_audio_s,
                                 failed=failed)  # fmt: skip

    return replace(metrics_recorder(metrics), spoke=spoke)


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
        tool_sources: Callable[[], list[ToolSource]] | None = None,
        remember: Callable[[str, str], None] | None = None,
        recorder: TurnRecorder | None = None,
        on_turn: Callable[[str], None] | None = None,  # a turn of this kind starts (metrics)
        phrases: Phrases | None = None,  # the fixed phrases' stored audio (gateway/speech/phrases.py)
        voice: VoiceChoice | None = None,  # the session's voice (its one owner); None: the configured one
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
        self.last: Turn | None = None  # the turn that ran last (or runs now)

    def new_turn(self, *, tools: Tools = None, started: float | None = None) -> Turn:
        self.last = Turn(
            engine=self._engine,
            llm=self._llm,
            send=self._send,
            config=self.config,
            voice=self.voice,
            tools=tools,
            emotion=self._features().get("emoji", True) is not False,
            recorder=self._recorder,
            started=started,
            phrases=self._phrases,
        )
        return self.last

    async def spoken(self, stt_text: str | None, texts: list[str], *, kind: str) -> None:
        """A turn with fixed sentences (greeting, notices)."""
        self._count(kind)
        await self.new_turn().say(texts, stt=stt_text)

    async def query(self, text: str) -> None:
        """The user said or typed `text`: `stt`, then the LLM's streamed answer."""
        self._count("query")
        turn = self.new_turn(tools=self._tools, started=time.monotonic())
        try:
            await turn.answer(text, self._conversation.messages_for(text))
        finally:
            answer = turn.answer_text
            if answer.strip():  # as far as it got when aborted
                self._conversation.add_turn(text, answer)
                if self._remember is not None:
                    self._remember(text, answer)

    def _count(self, kind: str) -> None:
        if self._on_turn is not None:
            self._on_turn(kind)

    async def _tools(self) -> ToolSet | None:
        """This turn's tools (none with `tools.enabled: false` or nothing offered)."""
        cfg = self._tools_config
        if cfg is None or not cfg.enabled or self._tool_sources is None:
            return None
        if not isinstance(self._llm, ToolCallingLLM):
            return None
        tools = await ToolSet.gather(
            self._tool_sources(),
            max_tools=cfg.max_tools,
            max_argument_chars=cfg.max_argument_chars,
            max_result_chars=cfg.max_result_chars,
        )
        return tools or None
