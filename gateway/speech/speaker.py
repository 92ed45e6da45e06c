"""Speaking one turn: sentences -> engine -> Opus -> paced frames.

The next sentence starts synthesising while the current one plays (one
sentence of look-ahead); `sentence_start` goes out just before the first audio
of its sentence. Each sentence tells the engine how much of this device's audio
will play before it (`playback_ahead`, a value in seconds: what the device still
holds plus the unread audio of the sentences before it), so the engine's slack
ranking puts a look-ahead sentence behind other devices' first chunks. The engine
decays the value at real time; it is sent again only when it changes materially
(an earlier sentence got a chunk or finished), not per frame. Everything here runs inside the turn's task group, so a
cancelled turn stops at its next await and sends nothing more.

Fixed phrases (the apology, the tool filler, the not-configured notice; gateway/speech/phrases.py) are played
from audio stored at start-up when the sentence is one of them in the voice they were stored in.

When the engine fails a sentence (refused at once, or failed mid-way: a worker lost, stalled, none
ready, overloaded), the reply ends there with the apology: the stored one when the engine cannot say it
either, else its text alone (``sentence_start``), so a device always hears or sees why. Nothing of the
reply is spoken after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from audio_codecs.opus import OpusEncoder
from gateway.speech.pacer import Pacer
from gateway.speech.phrases import Phrases
from gateway.speech.voice_choice import VoiceChoice
from gateway.xiaozhi import AudioOut, Event, TtsSentenceStart
from tts_engine import SpeechEngine, SpeechStream
from tts_engine.errors import EngineError

log = logging.getLogger(__name__)

AHEAD_TOLERANCE_S = 0.05  # a playback credit off by more than this is sent again

Send = Callable[[Event], Awaitable[None]]


class _Refused:
    """The engine refused a sentence: the reply ends here (with the apology)."""


REFUSED = _Refused()


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
        engine: SpeechEngine,
        encoder: OpusEncoder,
        send: Send,
        voice: VoiceChoice,  # read at each sentence (change_voice)
        pacer: Pacer,
        on_frame: Callable[[], None] | None = None,
        on_sentence_error: Callable[[], None] | None = None,
        apology: str | None = None,
        phrases: Phrases | None = None,
    ) -> None:
        """``apology`` ends the reply when the engine fails a sentence; ``phrases``: stored audio."""
        self._engine = engine
        self._encoder = encoder
        self._send = send
        self._voice = voice
        self._rate = encoder.sample_rate  # the output rate: what the device's decoder plays
        self._pacer = pacer
        self._on_frame = on_frame
        self._on_sentence_error = on_sentence_error
        self._apology = apology
        self._phrases = phrases
        self.result = SpeakResult()
        self._queued: list[SpeechStream] = []  # open sentence streams, in playing order
        self._unsent_frames = 0  # encoded frames of the current chunk still waiting for the pacer
        # the playback credit last sent to each queued stream, and when (monotonic)
        self._sent_ahead: dict[SpeechStream, tuple[float, float]] = {}

    async def speak(self, sentences: AsyncIterator[str]) -> SpeakResult:
        ready: asyncio.Queue[tuple[str, SpeechStream] | _Refused | None] = asyncio.Queue(maxsize=1)
        try:
            async with asyncio.TaskGroup() as tg:
                producer = tg.create_task(self._synthesise_ahead(sentences, ready))
                while (item := await ready.get()) is not None:
                    if isinstance(item, _Refused):
                        await self._end_with_apology(producer)
                        break
                    text, stream = item
                    try:
                        async with stream:
                            spoken = await self._play_sentence(text, stream)
                    finally:
                        self._queued.remove(stream)
                        self._sent_ahead.pop(stream, None)
                        self._refresh_ahead()  # a sentence finished: the next plays after the device's rest
                    if not spoken:
                        await self._end_with_apology(producer)
                        break
                for packet in self._encoder.flush():
                    await self._send_frame(packet)
        finally:
            while not ready.empty():
                item = ready.get_nowait()
                if isinstance(item, tuple):
                    await item[1].aclose()
            for stream in list(self._queued):  # one the producer made but could not hand over
                await stream.aclose()
            self._encoder.clear()
        self.result.underruns = self._pacer.underruns
        return self.result

    async def _synthesise_ahead(
        self, sentences: AsyncIterator[str], ready: asyncio.Queue[tuple[str, SpeechStream] | _Refused | None]
    ) -> None:
        async for text in sentences:
            voice = self._voice_now()
            stream: SpeechStream | None = self._phrases.stream(text, voice) if self._phrases else None
            if stream is None:
                try:
                    ahead = self._ahead_of(tuple(self._queued))
                    stream = self._engine.synthesize(
                        text, voice=voice, output_rate=self._rate, playback_ahead=ahead, priority="device"
                    )
                    self._sent_ahead[stream] = (ahead, time.monotonic())
                except (EngineError, ValueError) as exc:
                    log.warning("synthesis of %r refused: %s", text[:40], exc)
                    self._sentence_failed()
                    await ready.put(REFUSED)
                    return
            self._queued.append(stream)
            try:
                await ready.put((text, stream))
            except BaseException:
                await stream.aclose()
                self._queued.remove(stream)
                raise
        await ready.put(None)

    def _sentence_failed(self) -> None:
        self.result.failed_sentences += 1
        if self._on_sentence_error:
            self._on_sentence_error()

    def _voice_now(self) -> str | None:
        return self._voice.current

    def _ahead_of(self, earlier: tuple[SpeechStream, ...]) -> float:
        """Seconds of this device's audio that play before a sentence queued behind ``earlier``, now."""
        pacer = self._pacer
        play_end = pacer.play_end
        on_device = max(0.0, play_end - time.monotonic()) if play_end is not None else 0.0
        unsent = self._unsent_frames * pacer.frame_s
        return on_device + unsent + sum(s.unread_seconds for s in earlier if not s.is_aborted)

    def _refresh_ahead(self) -> None:
        """Send each queued sentence its playback credit again where it moved away from what the engine
        has (the value it was last sent, decayed at real time) by more than AHEAD_TOLERANCE_S."""
        now = time.monotonic()
        for index, stream in enumerate(self._queued):
            if stream.is_aborted:
                continue
            ahead = self._ahead_of(tuple(self._queued[:index]))
            sent, sent_at = self._sent_ahead.get(stream, (0.0, now))
            if abs(ahead - max(0.0, sent - (now - sent_at))) > AHEAD_TOLERANCE_S:
                stream.set_playback_ahead(ahead)
                self._sent_ahead[stream] = (ahead, now)

    async def _play_sentence(self, text: str, stream: SpeechStream) -> bool:
        """Play one sentence's audio as it comes; False when the engine failed it (logged, counted)."""
        announced = False
        try:
            async for chunk in stream:
                if not announced:
                    await self._send(TtsSentenceStart(text=text))
                    self.result.spoken.append(text)
                    announced = True
                packets = self._encoder.encode(chunk)
                self._unsent_frames = len(packets)
                self._refresh_ahead()  # this sentence got a chunk: the ones behind it wait longer
                for packet in packets:
                    await self._send_frame(packet)
                    self._unsent_frames -= 1
        except EngineError as exc:
            log.warning("synthesis of %r failed: %s", text[:40], exc)
            self._sentence_failed()
            return False
        return True

    async def _end_with_apology(self, producer: asyncio.Task[None]) -> None:
        """The engine failed a sentence: nothing more of the reply, then the apology (once per turn).

        In the turn's voice from the store, else from the engine (another worker may speak), else the
        stored one in its own voice, else its text alone: the device always hears or sees why.
        """
        producer.cancel()  # no more sentences (the LLM stream and tool calls stop with the turn)
        for queued in list(self._queued):
            await queued.aclose()
        if not self._apology:
            return
        apology, self._apology = self._apology, None
        phrases = self._phrases
        stream: SpeechStream | None = phrases.stream(apology, self._voice_now()) if phrases else None
        if stream is None:
            try:
                stream = self._engine.synthesize(
                    apology, voice=self._voice_now(), output_rate=self._rate, priority="device"
                )
            except (EngineError, ValueError) as exc:
                log.warning("the apology could not be synthesised either: %s", exc)
                stream = phrases.any_voice(apology) if phrases else None
        if stream is None:
            await self._send(TtsSentenceStart(text=apology))
            self.result.spoken.append(apology)
            return
        async with stream:
            if await self._play_sentence(apology, stream):
                return
        stored = phrases.any_voice(apology) if phrases else None  # the engine failed it mid-way too
        if stored is not None:
            async with stored:
                await self._play_sentence(apology, stored)

    async def _send_frame(self, packet: bytes) -> None:
        await self._pacer.wait_turn()
        await self._send(AudioOut(opus=packet))
        self._pacer.mark_sent()
        self.result.frames += 1
        if self.result.first_frame_at is None:
            self.result.first_frame_at = time.monotonic()
        if self._on_frame:
            self._on_frame()
