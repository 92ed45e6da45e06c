"""One device connection: reads messages in order, runs one turn at a time.

A turn is a task (with its own task group inside the speaker); abort, a new
query or the end of the connection cancel it, and its `finally` sends the one
`tts stop` that matches its `tts start`. Only `_send` touches the transport (gateway/transport/: the
WebSocket, or MQTT with UDP audio; the session is the same on both).

The device's agent (gateway/agents) is read at hello and at every turn (`Turns.current_agent`): its
role, voice, LLM and tools apply from the next turn; the session applies its idle timeouts and restores
the device's memory when the agent has memory on. The device registry (gateway/devices) hears when the
session begins and ends, and each turn's first-audio latency.

Its parts: the turns (gateway/speech/turns.py, one `Turn` per reply, gateway/speech/turn.py),
the hello, the agent and echo cancellation (gateway/device/hello.py), listening (gateway/device/listen.py), tools (gateway/device/session_tools.py), the idle
deadlines (gateway/device/idle.py). The registry of live sessions belongs to the
device socket (gateway/device/socket.py, gateway/device/registry.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from typing import Any

import numpy as np

from gateway.aec import EchoCanceller
from gateway.device.hello import HelloHandling
from gateway.device.idle import IdleClock
from gateway.device.listen import ListenHandling, TaskFactory
from gateway.device.listener import Listener
from gateway.device.mcp_client import DeviceMcpClient
from gateway.device.session_tools import SessionTools
from gateway.llm.conversation import Conversation
from gateway.services import Services
from gateway.speech.turns import Turns, metrics_recorder, usage_recorder
from gateway.speech.voice_choice import VoiceChoice
from gateway.transport.base import DatagramAudio, DeviceTransport, UplinkLoss
from gateway.xiaozhi import (
    Abort,
    AudioIn,
    AudioOut,
    Event,
    HandshakeInfo,
    Hello,
    Listen,
    ListenMode,
    McpMessage,
    RemoteProtocolError,
    Role,
    Stt,
    TtsStart,
    TtsStop,
    XiaozhiConnection,
)

log = logging.getLogger(__name__)


DeviceSocket = DeviceTransport  # the name the WebSocket path has always used


class SessionClosed(Exception):
    """The socket went away while sending."""


class Session(ListenHandling, HelloHandling):
    """``socket`` is the device's transport (gateway/transport/base.py); ``datagrams`` is given when its
    audio travels as UDP datagrams (MQTT devices): the hello then says `transport: "udp"` with the
    `udp` object, and audio goes to it instead of binary messages. ``origin``: ``http(s)://host[:port]``
    as the device reached us (our vision URL is made from it; None over MQTT)."""

    def __init__(
        self,
        socket: DeviceTransport,
        info: HandshakeInfo,
        services: Services,
        *,
        datagrams: DatagramAudio | None = None,
        origin: str | None = None,
    ) -> None:
        cfg = services.config
        self.socket = socket
        self.datagrams = datagrams
        self.info = info
        self.services = services
        self.origin = origin
        self.session_id = str(uuid.uuid4())
        self.conn = XiaozhiConnection(
            Role.SERVER,
            binary_version=info.protocol_version,
            session_id=self.session_id,
            max_text_bytes=cfg.session.max_text_frame_bytes,
            max_binary_bytes=cfg.session.max_binary_frame_bytes,
            transport="websocket" if datagrams is None else "udp",
        )
        self.listener = Listener(cfg.asr.vad, max_utterance_s=cfg.audio.max_utterance_s)
        self.conversation = Conversation(cfg.llm.system_prompt, max_turns=cfg.llm.max_history_turns)
        self.voice = VoiceChoice(
            services.turns.voice
        )  # the session's voice: the tools change it, turns read it
        self.tools = SessionTools(
            cfg,
            session_id=self.session_id,
            voices=lambda: services.engine.voices,
            voice=self.voice,
            shared=services.tool_sources,
            device=lambda: self.mcp,
        )
        devices, agents = services.devices, services.agents
        device_id = info.device_id
        latency = (
            (lambda s: devices.turn_latency(device_id, s)) if devices is not None and device_id else None
        )
        self.turns = Turns(
            engine=services.engine,
            llm=services.llm,
            send=self._send,
            config=services.turns,
            conversation=self.conversation,
            features=lambda: self.features,
            tools=cfg.tools,
            tool_sources=self.tools.sources,
            remember=self._remember if services.memory is not None and info.device_id else None,
            recorder=(
                usage_recorder(services.metrics, services.usage, info.device_id, latency=latency)
                if info.device_id
                else metrics_recorder(services.metrics, latency=latency)
            ),
            on_turn=lambda kind: services.metrics.turns_total.labels(kind).inc(),
            phrases=services.phrases,
            voice=self.voice,
            agent=self._read_agent if agents is not None else None,
            llms=services.llms,
            on_agent=self._on_agent,
            expressive=cfg.agents.expressive_instructs,
            greeting=cfg.session.greeting,
        )
        self._memory_restored = False
        self._agent_waits = True  # the hello's read of the agent waits for a store that is down
        self.mode = ListenMode.AUTO
        self.listening = False
        self.features: dict[str, Any] = {}
        self.mcp: DeviceMcpClient | None = None
        self.echo: EchoCanceller | None = None  # server-side AEC, chosen at hello (asr.aec)
        self._turn: asyncio.Task[None] | None = None
        self._turn_lock = asyncio.Lock()
        self._recognition: asyncio.Task[None] | None = None  # speech being recognised
        self._recognising = np.zeros(0, np.int16)
        self._tg: asyncio.TaskGroup | None = None
        self._send_lock = asyncio.Lock()
        self._tts_stops_sent = 0
        self.idle = IdleClock(cfg.session, busy=self._busy)
        self._started = self.idle.started
        self._closing = False

    @property
    def watchdog_wakeups(self) -> int:
        return self.idle.wakeups

    @property
    def _hello_done(self) -> bool:
        return self.idle.hello_done

    # ---- lifecycle -------------------------------------------------------

    async def run(self) -> None:
        metrics = self.services.metrics
        metrics.sessions_total.inc()
        metrics.sessions_active.inc()
        devices, device_id = self.services.devices, self.info.device_id
        if devices is not None and device_id:
            devices.spawn(devices.connected(device_id, self.info.client_id), f"connect of {device_id}")
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                watchdog = tg.create_task(self._watchdog())
                try:
                    await self._read_loop()
                finally:
                    watchdog.cancel()
                    self._cancel_recognition()
                    await self._cancel_turn()
                    if self.mcp:
                        self.mcp.cancel_all()
        finally:
            metrics.sessions_active.dec()
            self._tg = None
            self._observe_echo()
            if devices is not None and device_id:
                devices.spawn(devices.disconnected(device_id), f"disconnect of {device_id}")

    def forget_history(self) -> None:
        """Drop the conversation so far (its memory store is the caller's)."""
        self.conversation.clear()

    async def close(self, code: int = 1000) -> None:
        """Ends the session from outside (timeout, replaced by a new connection)."""
        self._closing = True
        with contextlib.suppress(Exception):
            await self.socket.close(code)

    async def _read_loop(self) -> None:
        while not self._closing:
            message = await self.socket.receive()
            if message is None:
                return
            if isinstance(message, bytes):
                await self._on_binary(message)
            elif isinstance(message, str):
                await self._on_text(message)
            elif isinstance(message, AudioIn):
                await self._on_audio(message)
            else:
                await self._on_loss(message)

    async def _watchdog(self) -> None:
        """Ends the session at its idle deadline (gateway/device/idle.py)."""
        reason = await self.idle.expired(lambda: self._closing)
        if reason is not None:
            await self._end(reason)

    def _busy(self) -> bool:
        """A reply is playing or an utterance is being recognised."""
        return any(task is not None and not task.done() for task in (self._turn, self._recognition))

    async def _end(self, reason: str) -> None:
        """Closes the session from the inside; a reply still playing gets its `tts stop` first."""
        log.info("session %s closing: %s", self.session_id, reason)
        self._closing = True
        self._cancel_recognition()
        async with self._turn_lock:
            await self._cancel_turn()
        await self.close()

    # ---- sending -----------------------------------------------------------

    async def _send(self, event: Event) -> None:
        if isinstance(event, AudioOut) and self.echo is not None:
            # the echo reference; v2 frames (and UDP packets) carry their play start for the device to echo back
            start_ms = self.echo.reference.add_packet(event.opus, self._now_ms())
            event = dataclasses.replace(event, timestamp_ms=int(start_ms) & 0xFFFFFFFF)
        if isinstance(event, AudioOut) and self.datagrams is not None:
            if self.echo is None:  # the timestamp field carries the session's playback clock either way
                event = dataclasses.replace(event, timestamp_ms=int(self._now_ms()) & 0xFFFFFFFF)
            self.datagrams.send_audio(event)  # paced by the turn, as on the WebSocket; never blocks
            return
        data = self.conn.send(event)
        if isinstance(event, TtsStop):
            self._tts_stops_sent += 1
        async with self._send_lock:
            try:
                if isinstance(data, bytes):
                    await self.socket.send_bytes(data)
                else:
                    await self.socket.send_text(data)
            except Exception as exc:  # the socket's own errors differ per server
                raise SessionClosed(str(exc)) from exc

    # ---- receiving ---------------------------------------------------------

    async def _on_binary(self, data: bytes) -> None:
        if not self._hello_done:
            return
        try:
            audio = self.conn.receive_binary(data)
        except RemoteProtocolError as exc:
            self.services.metrics.protocol_errors.labels("binary").inc()
            log.debug("session %s: dropped binary frame: %s", self.session_id, exc)
            return
        if isinstance(audio, AudioIn):  # always, on a server-role connection
            await self._on_audio(audio)

    async def _on_audio(self, audio: AudioIn) -> None:
        """One uplink Opus packet, from a binary message or a UDP datagram."""
        if not self._hello_done:
            return
        self.services.metrics.frames_received.inc()
        if self.listening and audio.opus:
            before = self.listener.dropped_samples
            events = self.listener.push(audio.opus, timestamp_ms=audio.timestamp_ms)
            if self.listener.dropped_samples != before:
                self.services.metrics.utterance_overflow.inc()
            for event in events:
                await self._on_speech(event)

    async def _on_loss(self, loss: UplinkLoss) -> None:
        """Uplink packets lost in transit (UDP): the decoder conceals them, so the utterance keeps its time."""
        if not (self._hello_done and self.listening) or loss.packets <= 0:
            return
        for event in self.listener.conceal(loss.packets):
            await self._on_speech(event)

    async def _on_text(self, text: str) -> None:
        try:
            event = self.conn.receive_text(text)
        except RemoteProtocolError as exc:
            self.services.metrics.protocol_errors.labels("text").inc()
            log.info("session %s: dropped text frame: %s", self.session_id, exc)
            return
        if isinstance(event, Hello):
            await self._on_hello(event)
        elif not self._hello_done:
            log.info("session %s: %s before hello ignored", self.session_id, type(event).__name__)
        elif isinstance(event, Listen):
            await self._on_listen(event)
        elif isinstance(event, Abort):
            await self._abort()
        elif isinstance(event, McpMessage):
            if self.mcp is not None:
                self.mcp.handle(event.payload)
        else:
            log.debug("session %s: ignoring %s", self.session_id, type(event).__name__)

    def _now_ms(self) -> float:
        return (time.monotonic() - self._started) * 1000

    # ---- turns -------------------------------------------------------------

    async def _start_turn(self, make_turn: TaskFactory) -> None:
        """Replaces the running turn by a new one.

        The turn's coroutine is made inside its task: a turn cancelled before its
        task first ran (an abort right behind the query) leaves no coroutine behind.
        """
        async with self._turn_lock:  # the reader and a recognition may both start turns
            await self._cancel_turn(aborted=True)
            if self._tg is None or self._closing:
                return
            self._turn = self._tg.create_task(self._guard(make_turn, "turn"))
            self._turn.add_done_callback(self.idle.became_quiet)

    async def _cancel_turn(self, *, aborted: bool = False) -> bool:
        """Cancels the running turn (its finally sends `tts stop`); True if one ran."""
        task, self._turn = self._turn, None
        if task is None or task.done():
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if aborted:
            self.services.metrics.turns_aborted.inc()
        return True

    async def _abort(self) -> None:
        """Stops the reply; answered by exactly one `tts stop`.

        A turn that was speaking sends its own; one cancelled before it started
        speaking (or no turn at all) sends none, so this does.
        """
        stops = self._tts_stops_sent
        await self._cancel_turn(aborted=True)
        if self._tts_stops_sent == stops:
            with contextlib.suppress(SessionClosed):
                await self._send(TtsStop())

    async def _guard(self, make: TaskFactory, what: str) -> None:
        """Runs one task body; its failure is logged and never ends the session."""
        try:
            await make()
        except SessionClosed:
            pass
        except Exception:
            log.exception("session %s: %s failed", self.session_id, what)

    async def _query_turn(self, text: str) -> None:
        """The LLM's answer to `text`; the session closes after it if it ended the conversation."""
        self.tools.end_requested = False
        await self.turns.query(text)
        if self.tools.end_requested and self._tg is not None:
            log.info("session %s: the conversation was ended by the LLM", self.session_id)
            self._tg.create_task(self.close())  # from its own task, as in _exit_turn

    async def _exit_turn(self, text: str) -> None:
        self.services.metrics.turns_total.labels("exit").inc()
        await self._send(Stt(text=text))
        await self._send(TtsStart())
        await self._send(TtsStop())
        # Closed from its own task: this turn task is cancelled when the session ends.
        if self._tg is not None:
            self._tg.create_task(self.close())
