"""The turn speaker tells the engine how much of the device's audio plays before each sentence."""

from __future__ import annotations

import asyncio

from audio_codecs.opus import OpusEncoder
from gateway.speech.pacer import Pacer
from gateway.speech.reply import fixed_sentences
from gateway.speech.speaker import Speaker
from gateway.speech.voice_choice import VoiceChoice
from gateway.xiaozhi import AudioOut, TtsSentenceStart
from tts_engine import TTSEngine
from tts_engine.backends.fake import FakeBackend


class RecordingEngine:
    """The real engine, with each sentence's stream kept: its playback credit is what the engine ranks by."""

    def __init__(self, engine: TTSEngine) -> None:
        self._engine = engine
        self.streams: list = []
        self.submitted: list[float] = []

    def synthesize(self, text: str, **kwargs):
        self.submitted.append(kwargs.get("playback_ahead"))
        stream = self._engine.synthesize(text, **kwargs)
        self.streams.append(stream)
        return stream


async def test_each_sentence_is_queued_behind_the_audio_before_it() -> None:
    # 0.96 s of audio per sentence, made at once; frames leave at playback speed
    engine = TTSEngine(FakeBackend(16000, chunk_ms=240, ms_per_char=120))
    await engine.start()
    recording = RecordingEngine(engine)
    seen: dict[str, list[float]] = {"before_audio": [], "first_sentence_playing": []}
    frames = 0

    async def send(message: object) -> None:
        nonlocal frames
        if isinstance(message, TtsSentenceStart) and frames == 0:
            seen["before_audio"].append(recording.streams[0].playback_ahead)
        if isinstance(message, AudioOut):
            frames += 1
            if frames == 6:  # the first sentence is playing, the second is ready behind it
                seen["first_sentence_playing"] = [s.playback_ahead for s in recording.streams]

    speaker = Speaker(
        engine=recording,  # type: ignore[arg-type]
        encoder=OpusEncoder(16000, 60),
        send=send,
        voice=VoiceChoice(None),
        pacer=Pacer(frame_s=0.06, lead_frames=2),
    )
    try:
        result = await asyncio.wait_for(speaker.speak(fixed_sentences(["abcdefgh", "ijklmnop"])), 10)
    finally:
        await engine.close()

    assert result.spoken == ["abcdefgh", "ijklmnop"]
    assert len(recording.streams) == 2 and all(isinstance(v, float) for v in recording.submitted)
    assert seen["before_audio"] == [0.0]  # nothing of this device plays before its first sentence
    first, second = seen["first_sentence_playing"]
    # 6 of the first sentence's 16 frames are out: its own hint is what it has made and the device
    # has not played yet outside its stream (2 frames on the device, the rest of the chunk in hand)
    assert first <= 0.3
    # the second waits behind the rest of the first: ~12 frames not played yet, give or take a frame
    assert 0.6 <= second <= 0.8
    assert second - first >= 0.4  # the first's unread chunks count for the second only
