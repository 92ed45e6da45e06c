"""Speaking one turn: sentences -> engine -> Opus -> paced frames.

The next sentence starts synthesising while the current one plays (one
sentence of look-ahead); `sentence_start` goes out just before the first audio
of its sentence. Everything here runs inside the turn's task group, so a
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

    async def speak(self, sentences: AsyncIterator[str]) -> SpeakResult:
        ready: asyncio.Queue[tuple[str, SynthesisStream] | None] = asyncio.Queue(maxsize=1)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._synthesise_ahead(sentences, ready))
                while (item := await ready.get()) is not None:
                    text, stream = item
                    async with stream:
                        await self._play_sentence(text, stream)
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
                stream = self._engine.synthesize(text, voice=self._voice, sample_rate=self._rate)
            except EngineError as exc:
                log.warning("synthesis of %r refused: %s", text[:40], exc)
                if self._on_sentence_error:
                    self._on_sentence_error()
                self.result.failed_sentences += 1
                continue
            try:
                await ready.put((text, stream))
            except BaseException:
                await stream.aclose()
                raise
        await ready.put(None)

    async def _play_sentence(self, text: str, stream: SynthesisStream) -> None:
        announced = False
        try:
            async for chunk in stream:
                if not announced:
                    await self._send(TtsSentenceStart(text=text))
                    self.result.spoken.append(text)
                    announced = True
                for packet in self._encoder.encode(chunk):
                    await self._send_frame(packet)
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
