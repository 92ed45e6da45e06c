"""TTSEngine voice plumbing: add/remove voices in the engine thread, instruct, one-off zero-shot prompts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from audio_codecs.wav import wav_bytes
from tts_engine import EngineClosed, EngineError, SynthesisStream, TTSEngine, UnknownVoice
from tts_engine.backends.fake import FakeBackend, FakeStream
from tts_engine.voices import PromptAudio, VoiceError, VoicePreset

TEXT = "Hello there."


def tone_wav(seconds: float = 2.0, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return wav_bytes((0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16), rate)


class CloningFake(FakeBackend):
    """A fake backend that clones: voices come and go, every call is recorded with its thread."""

    supports_cloning = True
    supports_instruct = True

    def __init__(self) -> None:
        super().__init__(24000, chunk_ms=100, ms_per_char=20.0, voices=("builtin",))
        self.calls: list[tuple[str, str, object]] = []  # (call, thread name, argument)

    def _record(self, call: str, arg: object) -> None:
        self.calls.append((call, threading.current_thread().name, arg))

    def add_voice(self, preset: VoicePreset) -> None:
        self._record("add_voice", preset.name)
        if preset.prompt_text == "FAIL":
            raise VoiceError(f"voice {preset.name!r} cannot be prepared")
        if preset.name not in self._voices:
            self._voices.append(preset.name)

    def remove_voice(self, name: str) -> None:
        self._record("remove_voice", name)
        self._voices.remove(name)

    def open_stream(self, text: str, voice: str, speed: float, instruct: str | None = None) -> FakeStream:
        self._record("open_stream", instruct)
        return super().open_stream(text, voice, speed)

    def open_zero_shot_stream(
        self, text: str, prompt: PromptAudio, prompt_text: str, speed: float, instruct: str | None = None
    ) -> FakeStream:
        self._record(
            "open_zero_shot_stream", (prompt.sample_rate, prompt.samples.size, prompt_text, instruct)
        )
        return super().open_stream(text, self.default_voice, speed)


class PlainFake(FakeBackend):
    """A fake that records the arguments its (three-argument) open_stream gets."""

    def __init__(self) -> None:
        super().__init__(24000, chunk_ms=100, ms_per_char=20.0)
        self.opened: list[tuple] = []

    def open_stream(self, *args, **kwargs) -> FakeStream:  # type: ignore[override]
        self.opened.append((args, kwargs))
        return super().open_stream(*args, **kwargs)


def preset(name: str, text: str = "你好。") -> VoicePreset:
    return VoicePreset(name, Path("/nonexistent.wav"), text)


async def read_all(stream: SynthesisStream) -> np.ndarray:
    async with asyncio.timeout(10):
        chunks = [chunk async for chunk in stream]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


@pytest.fixture
async def engine() -> AsyncIterator[TTSEngine]:
    engine = TTSEngine(CloningFake())
    await engine.start()
    yield engine
    await engine.close()


async def test_added_voice_is_prepared_in_the_engine_thread_and_usable(engine: TTSEngine) -> None:
    backend: CloningFake = engine._backend  # type: ignore[assignment]
    assert engine.supports_cloning and engine.voices == ["builtin"]
    await engine.add_voice(preset("alice"))
    assert engine.voices == ["builtin", "alice"]
    call, thread, arg = backend.calls[-1]
    assert (call, arg) == ("add_voice", "alice") and thread.startswith("tts-engine")
    audio = await read_all(engine.synthesize(TEXT, voice="alice", output_rate=24000))
    assert audio.size == backend.num_samples_for(TEXT)


async def test_failed_add_raises_and_leaves_the_voices_alone(engine: TTSEngine) -> None:
    with pytest.raises(VoiceError, match="cannot be prepared"):
        await engine.add_voice(preset("broken", text="FAIL"))
    assert engine.voices == ["builtin"]
    with pytest.raises(UnknownVoice):
        engine.synthesize(TEXT, voice="broken")


async def test_removed_voice_is_refused(engine: TTSEngine) -> None:
    await engine.add_voice(preset("alice"))
    await engine.remove_voice("alice")
    assert engine.voices == ["builtin"]
    with pytest.raises(UnknownVoice):
        engine.synthesize(TEXT, voice="alice")


async def test_instruct_reaches_a_backend_that_supports_it(engine: TTSEngine) -> None:
    backend: CloningFake = engine._backend  # type: ignore[assignment]
    await read_all(engine.synthesize(TEXT, instruct="  用四川话说 "))
    await read_all(engine.synthesize(TEXT, instruct=""))
    opened = [arg for call, _, arg in backend.calls if call == "open_stream"]
    assert opened == ["用四川话说", None]
    with pytest.raises(ValueError, match="instruct"):
        engine.synthesize(TEXT, instruct=123)  # type: ignore[arg-type]


async def test_backends_without_instruct_or_cloning_ignore_instruct_and_refuse_voices() -> None:
    backend = PlainFake()
    engine = TTSEngine(backend)
    await engine.start()
    try:
        audio = await read_all(engine.synthesize(TEXT, instruct="用四川话说", output_rate=24000))
        assert audio.size == backend.num_samples_for(TEXT)
        assert backend.opened == [((TEXT, "default", 1.0), {})]  # called without the instruction
        assert not engine.supports_cloning and engine.health()["supports_cloning"] is False
        with pytest.raises(VoiceError, match="cannot clone"):
            await engine.add_voice(preset("alice"))
        with pytest.raises(VoiceError, match="cannot clone"):
            await engine.remove_voice("default")
        with pytest.raises(VoiceError, match="cannot clone"):
            engine.synthesize_zero_shot(TEXT, prompt_wav=tone_wav(), prompt_text="x")
    finally:
        await engine.close()


async def test_zero_shot_checks_the_recording_then_prepares_it_in_the_engine(engine: TTSEngine) -> None:
    backend: CloningFake = engine._backend  # type: ignore[assignment]
    with pytest.raises(VoiceError, match="not a readable WAV"):
        engine.synthesize_zero_shot(TEXT, prompt_wav=b"junk", prompt_text="x")
    with pytest.raises(VoiceError, match="s long"):
        engine.synthesize_zero_shot(TEXT, prompt_wav=tone_wav(0.3), prompt_text="x")
    stream = engine.synthesize_zero_shot(
        TEXT, prompt_wav=tone_wav(2.0, 22050), prompt_text=" 你好。 ", output_rate=16000, instruct="慢一点"
    )
    audio = await read_all(stream)
    assert audio.size == pytest.approx(backend.num_samples_for(TEXT) * 2 / 3, abs=2)
    call, thread, arg = backend.calls[-1]
    assert call == "open_zero_shot_stream" and thread.startswith("tts-engine")
    assert arg == (22050, 44100, "你好。", "慢一点")
    empty = await read_all(engine.synthesize_zero_shot("  ", prompt_wav=tone_wav(), prompt_text="x"))
    assert empty.size == 0


async def test_voice_calls_need_a_running_engine() -> None:
    engine = TTSEngine(CloningFake())
    with pytest.raises(EngineError, match="not started"):
        await engine.add_voice(preset("alice"))
    await engine.start()
    await engine.close()
    with pytest.raises(EngineClosed):
        await engine.add_voice(preset("alice"))
    with pytest.raises(EngineClosed):
        engine.synthesize_zero_shot(TEXT, prompt_wav=tone_wav(), prompt_text="x")


async def test_a_voice_call_waits_for_the_running_step_and_survives_a_cancelled_caller(
    engine: TTSEngine,
) -> None:
    backend: CloningFake = engine._backend  # type: ignore[assignment]
    backend.compute_delay_s = 0.02
    stream = engine.synthesize("x" * 40, output_rate=24000)
    task = asyncio.create_task(engine.add_voice(preset("late")))
    await asyncio.sleep(0)
    task.cancel()
    audio = await read_all(stream)
    assert audio.size == backend.num_samples_for("x" * 40)
    async with asyncio.timeout(5):
        while "late" not in engine.voices:
            await asyncio.sleep(0.01)
    assert [c for c in backend.calls if c[0] == "add_voice"][-1][2] == "late"
