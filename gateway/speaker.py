"""Speaking one turn: sentences -> engine -> Opus -> paced frames.

The next sentence starts synthesising while the current one plays (one
sentence of look-ahead); `sentence_start` goes out just before the first audio
of its sentence. Each sentence tells the engine how much of this device's audio
will play before it (`playback_ahead`: what the device still holds plus the
unread audio of the sentences before it), so the engine's slack ranking puts a
look-ahead sentence behind other devices' first chunks. Everything here runs inside the turn's task group, so a
cancelled turn stops at its next await and sends nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from audio_codecs.opus import OpusEncoder
from gateway.pacer import Pacer
from gateway.xiaozhi import AudioOut, TtsSentenceStart
from tts_engine import SynthesisStream, TTSEngine
from tts_engine.errors import EngineError

log = logging.getLogger(__name__)

Send = Callable[[object], Awaitable[None]]


@dataclass
class SpeakResult:
    frames: int = 0
    underruns: int = 0
    first_frame_at: float | None = None
    spoken: list[str] = field(default_factory=list)
    failed_sentences: int = 0


class Speaker:
    def __init__(
        self,
        *,
        engine: TTSEngine,
        encoder: OpusEncoder,
        send: Send,
        voice: str | None,
        sample_rate: int,
        pacer: Pacer,
        on_frame: Callable[[], None] | None = None,
        on_sentence_error: Callable[[], None] | None = None,
    ) -> None:
        self._engine = engine
        self._encoder = encoder
        self._send = send
        self._voice = voice
        self._rate = sample_rate
        self._pacer = pacer
        self._on_frame = on_frame
        self._on_sentence_error = on_sentence_error
        self.result = SpeakResult()
        self._queued: list[SynthesisStream] = []  # open sentence streams, in playing order
        self._unsent_frames = 0  # encoded frames of the current chunk still waiting for the pacer

    async def speak(self, sentences: AsyncIterator[str]) -> SpeakResult:
        ready: asyncio.Queue[tuple[str, SynthesisStream] | None] = asyncio.Queue(maxsize=1)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._synthesise_ahead(sentences, ready))
                while (item := await ready.get()) is not None:
                    text, stream = item
                    try:
                        async with stream:
                            await self._play_sentence(text, stream)
                    finally:
                        self._queued.remove(stream)
                for packet in self._encoder.flush():
                    await self._send_frame(packet)
        finally:
            while not ready.empty():
                item = ready.get_nowait()
                if item is not None:
                    await item[1].aclose()
            self._encoder.clear()
        self.result.underruns = self._pacer.underruns
        return self.result

    async def _synthesise_ahead(
        self, sentences: AsyncIterator[str], ready: asyncio.Queue[tuple[str, SynthesisStream] | None]
    ) -> None:
        async for text in sentences:
            try:
                stream = self._engine.synthesize(
                    text,
                    voice=self._voice,
                    sample_rate=self._rate,
                    playback_ahead=self._ahead_of(tuple(self._queued)),
                )
            except EngineError as exc:
                log.warning("synthesis of %r refused: %s", text[:40], exc)
                if self._on_sentence_error:
                    self._on_sentence_error()
                self.result.failed_sentences += 1
                continue
            self._queued.append(stream)
            try:
                await ready.put((text, stream))
            except BaseException:
                await stream.aclose()
                raise
        await ready.put(None)

    def _ahead_of(self, earlier: tuple[SynthesisStream, ...]) -> Callable[[], float]:
        """Seconds of this device's audio that play before a sentence queued behind ``earlier``.
        Runs on the engine thread: it only reads plain attributes (the tuple never changes)."""
        pacer = self._pacer

        def ahead() -> float:
            play_end = pacer.play_end
            on_device = max(0.0, play_end - time.monotonic()) if play_end is not None else 0.0
            unsent = self._unsent_frames * pacer.frame_s
            return on_device + unsent + sum(s.unread_seconds for s in earlier if not s.is_aborted)

        return ahead

    async def _play_sentence(self, text: str, stream: SynthesisStream) -> None:
        announced = False
        try:
            async for chunk in stream:
                if not announced:
                    await self._send(TtsSentenceStart(text=text))
                    self.result.spoken.append(text)
                    announced = True
                packets = self._encoder.encode(chunk)
                self._unsent_frames = len(packets)
                for packet in packets:
                    await self._send_frame(packet)
                    self._unsent_frames -= 1
        except EngineError as exc:
            log.warning("synthesis of %r failed: %s", text[:40], exc)
            self.result.failed_sentences += 1
            if self._on_sentence_error:
                self._on_sentence_error()

    async def _send_frame(self, packet: bytes) -> None:
        await self._pacer.wait_turn()
        await self._send(AudioOut(opus=packet))
        self._pacer.mark_sent()
        self.result.frames += 1
        if self.result.first_frame_at is None:
            self.result.first_frame_at = time.monotonic()
        if self._on_frame:
            self._on_frame()
