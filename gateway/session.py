"""One device connection: reads messages in order, runs one turn at a time.

A turn is a task (with its own task group inside the speaker); abort, a new
query or the end of the connection cancel it, and its `finally` sends the one
`tts stop` that matches its `tts start`. Only `_send` touches the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import unicodedata
import uuid
from collections.abc import Coroutine
from typing import Any, Protocol

import numpy as np

from audio_codecs.opus import OpusEncoder
from gateway.asr import ASRError, ASRNotConfigured
from gateway.listener import Listener, ListenEvent, UtteranceEnded, UtteranceStarted
from gateway.llm.conversation import Conversation
from gateway.mcp_client import DeviceMcpClient
from gateway.services import Services
from gateway.turns import Turns
from gateway.xiaozhi import (
    Abort,
    AudioParams,
    HandshakeInfo,
    Hello,
    Listen,
    ListenMode,
    ListenState,
    McpMessage,
    RemoteProtocolError,
    Role,
    ServerHello,
    Stt,
    TtsStart,
    TtsStop,
    XiaozhiConnection,
)

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0


class DeviceSocket(Protocol):
    async def receive(self) -> str | bytes | None: ...
    async def send_text(self, text: str) -> None: ...
    async def send_bytes(self, data: bytes) -> None: ...
    async def close(self, code: int = 1000) -> None: ...


class SessionClosed(Exception):
    """The socket went away while sending."""


def _bare(text: str) -> str:
    """Text without punctuation, symbols and spaces, for wake-word comparison."""
    return "".join(ch for ch in text if unicodedata.category(ch)[0] in "LN")


class Session:
    def __init__(self, socket: DeviceSocket, info: HandshakeInfo, services: Services) -> None:
        cfg = services.config
        self.socket = socket
        self.info = info
        self.services = services
        self.session_id = str(uuid.uuid4())
        self.conn = XiaozhiConnection(
            Role.SERVER,
            binary_version=info.protocol_version,
            session_id=self.session_id,
            max_text_bytes=cfg.session.max_text_frame_bytes,
            max_binary_bytes=cfg.session.max_binary_frame_bytes,
        )
        self.sample_rate = cfg.audio.output_sample_rate
        self.encoder = OpusEncoder(
            self.sample_rate,
            cfg.audio.frame_ms,
            bitrate=cfg.audio.opus_bitrate,
            complexity=cfg.audio.opus_complexity,
        )
        self.listener = Listener(cfg.asr.vad, max_utterance_s=cfg.audio.max_utterance_s)
        self.conversation = Conversation(cfg.llm.system_prompt, max_turns=cfg.llm.max_history_turns)
        self.turns = Turns(
            services=services,
            send=self._send,
            encoder=self.encoder,
            sample_rate=self.sample_rate,
            conversation=self.conversation,
            features=lambda: self.features,
        )
        self.mode = ListenMode.AUTO
        self.listening = False
        self.features: dict[str, Any] = {}
        self.mcp: DeviceMcpClient | None = None
        self._hello_done = False
        self._turn: asyncio.Task[None] | None = None
        self._turn_lock = asyncio.Lock()
        self._recognition: asyncio.Task[None] | None = None  # speech being recognised
        self._recognising = np.zeros(0, np.int16)
        self._tg: asyncio.TaskGroup | None = None
        self._send_lock = asyncio.Lock()
        self._started = time.monotonic()
        self._last_activity = self._started
        self._last_voice = self._started
        self._activity = asyncio.Event()
        self._closing = False

    # ---- lifecycle -------------------------------------------------------

    async def run(self) -> None:
        metrics = self.services.metrics
        metrics.sessions_total.inc()
        metrics.sessions_active.inc()
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
            else:
                await self._on_text(message)

    async def _watchdog(self) -> None:
        cfg = self.services.config.session
        while True:
            now = time.monotonic()
            if self._turn is not None and not self._turn.done():
                self._last_activity = now
            if not self._hello_done:
                deadline = self._started + HELLO_TIMEOUT_S
                reason = "no hello"
            else:
                voice_deadline = self._last_voice + cfg.idle_no_voice_s
                hard_deadline = self._last_activity + cfg.idle_hard_s
                deadline = min(voice_deadline, hard_deadline)
                reason = "no speech" if voice_deadline <= hard_deadline else "no activity"
            if now >= deadline and (self._turn is None or self._turn.done()):
                log.info("session %s closing: %s", self.session_id, reason)
                await self.close()
                return
            self._activity.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(deadline - now, 0.05)):
                    await self._activity.wait()

    def _touch(self, *, voice: bool = False) -> None:
        self._last_activity = time.monotonic()
        if voice:
            self._last_voice = self._last_activity
        self._activity.set()

    # ---- sending -----------------------------------------------------------

    async def _send(self, event: object) -> None:
        data = self.conn.send(event)
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
        self.services.metrics.frames_received.inc()
        if self.listening and audio.opus:
            before = self.listener.dropped_samples
            events = self.listener.push(audio.opus)
            if self.listener.dropped_samples != before:
                self.services.metrics.utterance_overflow.inc()
            for event in events:
                await self._on_speech(event)

    async def _on_text(self, text: str) -> None:
        try:
            event = self.conn.receive_text(text)
        except RemoteProtocolError as exc:
            self.services.metrics.protocol_errors.labels("text").inc()
            log.info("session %s: dropped text frame: %s", self.session_id, exc)
            return
        self._touch()
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

    async def _on_hello(self, hello: Hello) -> None:
        self.features = dict(hello.features or {})
        params = AudioParams(format="opus", sample_rate=self.sample_rate, channels=1, frame_duration=60)
        start_mcp = not self._hello_done and bool(self.features.get("mcp")) and self._tg is not None
        if start_mcp:
            self.mcp = DeviceMcpClient(self._send_mcp, timeout_s=self.services.config.session.mcp_timeout_s)
        await self._send(ServerHello(session_id=self.session_id, audio_params=params))
        self._hello_done = True
        if start_mcp and self.mcp is not None and self._tg is not None:
            self._tg.create_task(self._guard(self.mcp.start(), "mcp"))

    async def _send_mcp(self, payload: dict[str, Any]) -> None:
        await self._send(McpMessage(payload=payload))

    async def _on_listen(self, listen: Listen) -> None:
        if listen.state == ListenState.START:
            if listen.mode is not None:
                self.mode = listen.mode
            self.listener.reset(endpointing=self.mode != ListenMode.MANUAL)
            self.listening = True
        elif listen.state == ListenState.STOP:
            self.listening = False
            pcm = self.listener.take()
            if pcm.size >= self.services.config.asr.min_utterance_s * 16000:
                self._touch(voice=True)
                self._recognise(pcm)
        elif listen.state == ListenState.DETECT:
            await self._on_detect((listen.text or "").strip())

    async def _on_detect(self, text: str) -> None:
        # The wake word's own audio (burst before `detect`, tail after it) is no query.
        self._cancel_recognition()
        self.listener.mute(self.services.config.asr.vad.detect_mute_s)
        if not text:
            return
        self._touch(voice=True)
        cfg = self.services.config.session
        bare = _bare(text)
        if bare and bare in {_bare(w) for w in cfg.wake_words}:
            if cfg.enable_greeting:
                await self._start_turn(self.turns.spoken(None, [cfg.greeting], kind="greeting"))
            else:
                await self._start_turn(self.turns.spoken(text, [], kind="greeting"))
            return
        if bare and bare in {_bare(w) for w in cfg.exit_commands}:
            await self._start_turn(self._exit_turn(text))
            return
        await self._start_turn(self.turns.query(text))

    # ---- turns -------------------------------------------------------------

    async def _start_turn(self, turn: Coroutine[Any, Any, None]) -> None:
        try:
            async with self._turn_lock:  # the reader and a recognition may both start turns
                await self._cancel_turn(aborted=True)
                if self._tg is None or self._closing:
                    turn.close()
                    return
                self._turn = self._tg.create_task(self._guard(turn, "turn"))
        except asyncio.CancelledError:
            turn.close()
            raise

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
        if not await self._cancel_turn(aborted=True):
            with contextlib.suppress(SessionClosed):
                await self._send(TtsStop())

    async def _guard(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """Keeps one turn's failure from ending the session."""
        try:
            await coro
        except SessionClosed:
            pass
        except Exception:
            log.exception("session %s: %s failed", self.session_id, what)
        finally:
            self._touch()

    # ---- speech (listen modes, protocol §9 b-d) -------------------------------

    async def _on_speech(self, event: ListenEvent) -> None:
        if isinstance(event, UtteranceStarted):
            self._touch(voice=True)
            barge_in = self.mode == ListenMode.REALTIME and bool(self.features.get("aec"))
            if barge_in and self._turn is not None and not self._turn.done():
                await self._cancel_turn(aborted=True)  # with AEC: `tts stop` as soon as speech is heard
        elif isinstance(event, UtteranceEnded):
            self._touch(voice=True)
            if event.speech_s >= self.services.config.asr.min_utterance_s:
                self._recognise(event.pcm)

    def _recognise(self, pcm: np.ndarray) -> None:
        """Recognises an utterance in its own task; its text then starts the reply turn.

        The playing reply goes on until then (without AEC a reply is only cut by
        recognised speech). An utterance that ends while the previous one is still
        being recognised continues it: both are recognised together.
        """
        if self._tg is None or self._closing:
            return
        if self._recognition is not None and not self._recognition.done():
            self._recognition.cancel()
            pcm = np.concatenate([self._recognising, pcm])
        self._recognising = pcm
        self._recognition = self._tg.create_task(self._guarded_recognition(pcm))

    def _cancel_recognition(self) -> None:
        if self._recognition is not None:
            self._recognition.cancel()
        self._recognition = None

    async def _guarded_recognition(self, pcm: np.ndarray) -> None:
        await self._guard(self._recognition_task(pcm), "asr")

    async def _recognition_task(self, pcm: np.ndarray) -> None:
        try:
            text = (await self.services.asr.transcribe(pcm)).strip()
        except ASRNotConfigured:
            reply = self.services.config.asr.not_configured_reply
            await self._start_turn(self.turns.spoken(None, [reply], kind="notice"))
            return
        except ASRError as exc:
            log.warning("session %s: ASR failed: %s", self.session_id, exc)
            return
        if text:
            await self._start_turn(self.turns.query(text))

    async def _exit_turn(self, text: str) -> None:
        self.services.metrics.turns_total.labels("exit").inc()
        await self._send(Stt(text=text))
        await self._send(TtsStart())
        await self._send(TtsStop())
        # Closed from its own task: this turn task is cancelled when the session ends.
        if self._tg is not None:
            self._tg.create_task(self.close())
