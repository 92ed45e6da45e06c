"""A session's hello and its device's agent: the server's hello (audio parameters, UDP, MCP with the
camera's vision), the agent's idle timeouts and memory, and server-side echo cancellation.

`HelloHandling` is a part of `Session` (gateway/device/session.py), as `ListenHandling` is
(gateway/device/listen.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from gateway.aec import EchoCanceller, EchoReference
from gateway.agents.active import ActiveAgent
from gateway.device.mcp_client import DeviceMcpClient, VisionCapability
from gateway.xiaozhi import AudioParams, Hello, McpMessage, ServerHello

if TYPE_CHECKING:
    from gateway.device.idle import IdleClock
    from gateway.device.listen import TaskFactory
    from gateway.device.listener import Listener
    from gateway.llm.conversation import Conversation
    from gateway.services import Services
    from gateway.speech.turns import Turns
    from gateway.transport.base import DatagramAudio
    from gateway.xiaozhi import Event, HandshakeInfo

log = logging.getLogger("gateway.device.session")  # the session's one log


class HelloHandling:
    session_id: str
    info: HandshakeInfo
    origin: str | None
    services: Services
    datagrams: DatagramAudio | None
    listener: Listener
    conversation: Conversation
    turns: Turns
    idle: IdleClock
    features: dict[str, Any]
    mcp: DeviceMcpClient | None
    echo: EchoCanceller | None
    _tg: asyncio.TaskGroup | None
    _memory_restored: bool
    _agent_waits: bool

    if TYPE_CHECKING:  # the session's own, used here

        @property
        def _hello_done(self) -> bool: ...
        async def _send(self, event: Event) -> None: ...
        async def _guard(self, make: TaskFactory, what: str) -> None: ...
        def _now_ms(self) -> float: ...

    async def _on_hello(self, hello: Hello) -> None:
        self.features = dict(hello.features or {})
        agent = await self.turns.current_agent()  # its idle timeouts; the device's memory if it has it
        if agent is None and not self._hello_done:
            await self._restore_memory()
        self._setup_echo()
        params = AudioParams(
            format="opus", sample_rate=self.turns.config.sample_rate, channels=1, frame_duration=60
        )
        start_mcp = not self._hello_done and bool(self.features.get("mcp")) and self._tg is not None
        if start_mcp:
            cfg = self.services.config.session
            self.mcp = DeviceMcpClient(
                self._send_mcp, timeout_s=cfg.mcp_timeout_s, vision=self._vision(agent)
            )
        if self.datagrams is None:
            reply = ServerHello(session_id=self.session_id, audio_params=params)
        else:
            reply = ServerHello(session_id=self.session_id, audio_params=params, transport="udp",
                                udp=self.datagrams.udp_params())  # fmt: skip
        await self._send(reply)
        self.idle.greeted()  # the idle deadlines replace the hello deadline
        if start_mcp and self.mcp is not None and self._tg is not None:
            # `initialize` only after our hello reply went out: clients set up MCP on that reply.
            self._tg.create_task(self._guard(self.mcp.start, "mcp"))

    def _vision(self, agent: ActiveAgent | None) -> VisionCapability:
        """Where the device's camera sends photos: session.vision_url (a third-party endpoint: no token,
        the device's credentials never travel there), else ours when the agent has a vision model, with
        a token for this device (gateway/api/vision.py), else none."""
        url = self.services.config.session.vision_url
        vision = self.services.vision
        if url or vision is None or agent is None or agent.activation is not None:
            return VisionCapability(url=url, token="")
        if not vision.enabled_for(agent.profile) or not self.info.device_id:
            return VisionCapability()
        return vision.capability(self.info.device_id, self.origin)

    async def _read_agent(self) -> ActiveAgent:
        """The device's agent now; only the hello's read waits for a store known to be down."""
        agents = self.services.agents
        assert agents is not None
        wait, self._agent_waits = self._agent_waits, False
        return await agents.for_device(self.info.device_id, wait=wait)

    async def _on_agent(self, agent: ActiveAgent) -> None:
        """The session's part of the device's agent: idle timeouts, the device's memory."""
        profile = agent.profile
        self.idle.set_limits(profile.idle_no_voice_s, profile.idle_hard_s)
        if agent.memory and not self._memory_restored:
            self._memory_restored = True
            if not self.conversation.turns:  # never over this session's own talk
                await self._restore_memory()

    async def _restore_memory(self) -> None:
        """The device's remembered talk into the history (`session.memory: local`, a Device-Id)."""
        memory, device_id = self.services.memory, self.info.device_id
        if memory is None or not device_id:
            return
        remembered = await memory.restore(device_id)
        if not remembered.empty:
            self.conversation.restore(remembered.summary, remembered.turns)
            log.info("session %s: restored %d remembered exchanges", self.session_id, len(remembered.turns))

    def _remember(self, user_text: str, assistant_text: str, agent: ActiveAgent | None) -> None:
        if self.services.memory is not None and self.info.device_id:
            limit = agent.profile.memory_summary_chars if agent is not None else None
            self.services.memory.remember(
                self.info.device_id, user_text, assistant_text, summary_max_chars=limit
            )

    def _setup_echo(self) -> None:
        """Server-side AEC per `asr.aec`; `features.aec` is the device asking for it (protocol §3.1)."""
        setting = self.services.config.asr.aec
        wanted = setting == "on" or (setting == "auto" and bool(self.features.get("aec")))
        if wanted and self.echo is None:
            self.echo = EchoCanceller(EchoReference(), linear=self.services.config.asr.aec_double_talk)
            echo = self.echo
            self.listener.clean = lambda pcm, ts: echo.process(pcm, self._now_ms(), ts)

    def _observe_echo(self) -> None:
        if self.echo is not None and self.echo.frames:
            self.services.metrics.observe_aec(self.echo.stats())

    async def _send_mcp(self, payload: dict[str, Any]) -> None:
        await self._send(McpMessage(payload=payload))
