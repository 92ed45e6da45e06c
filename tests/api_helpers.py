"""Shared pieces of the HTTP/WS API tests: fake backends, audio checks, waiting."""

from __future__ import annotations

import asyncio
import io
import time
import wave
from collections.abc import Callable

import numpy as np

from audio_codecs.wav import float_to_int16, wav_bytes
from tts_engine.backends.fake import FakeBackend, FakeStream
from tts_engine.voices import PromptAudio, VoicePreset

RATE = 24000  # FakeBackend's native rate and the API's default rate: no resampling in between


def fake(**kw) -> FakeBackend:
    """A cheap fake: 20 ms of tone per character, 200 ms chunks."""
    kw.setdefault("ms_per_char", 20.0)
    return FakeBackend(**kw)


def slow(**kw) -> FakeBackend:
    """A slow fake: 100 ms chunks that take 100 ms each to compute (real time), 40 ms per character."""
    kw.setdefault("ms_per_char", 40.0)
    kw.setdefault("chunk_ms", 100)
    kw.setdefault("compute_delay_s", 0.1)
    return FakeBackend(**kw)


class CloningFakeBackend(FakeBackend):
    """A fake that can clone: an added voice gets the next pitch; records instructions and prompts."""

    supports_cloning = True
    supports_instruct = True

    def __init__(self, **kw) -> None:
        kw.setdefault("ms_per_char", 20.0)
        super().__init__(**kw)
        self.added: list[VoicePreset] = []
        self.instructions: list[str | None] = []
        self.zero_shot_prompts: list[tuple[PromptAudio, str]] = []

    def add_voice(self, preset: VoicePreset) -> None:
        if preset.name not in self._voices:
            self._voices.append(preset.name)
        self.added.append(preset)

    def remove_voice(self, name: str) -> None:
        self._voices.remove(name)

    def open_stream(self, text: str, voice: str, speed: float, instruct: str | None = None) -> FakeStream:
        self.instructions.append(instruct)
        return super().open_stream(text, voice, speed)

    def open_zero_shot_stream(
        self, text: str, prompt: PromptAudio, prompt_text: str, speed: float, instruct: str | None = None
    ) -> FakeStream:
        self.zero_shot_prompts.append((prompt, prompt_text))
        return super().open_stream(text, self.default_voice, speed)


def voice_hz(backend: FakeBackend, voice: str) -> float:
    """The fake's pitch for ``voice``: 220 Hz, then a quarter-tone up per voice."""
    return 220.0 * 2.0 ** (backend.voices().index(voice) / 24)


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    """The strongest frequency; zero-padded to 4 s so short clips still resolve a quarter-tone."""
    n = max(samples.size, 4 * rate)
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64) * np.hanning(samples.size), n=n))
    return float(np.fft.rfftfreq(n, 1 / rate)[int(np.argmax(spectrum))])


def prompt_wav(seconds: float = 2.0, rate: int = 16000) -> bytes:
    """A WAV recording usable as a cloning prompt (a 150 Hz tone)."""
    t = np.arange(int(seconds * rate)) / rate
    return wav_bytes(float_to_int16(0.3 * np.sin(2 * np.pi * 150 * t)), rate)


def read_wav_literally(data: bytes) -> tuple[np.ndarray, int]:
    """Parse WAV as the incumbent's pydub does: the data chunk size is taken as written."""
    with wave.open(io.BytesIO(data)) as reader:
        rate, frames = reader.getframerate(), reader.readframes(reader.getnframes())
        assert reader.getnchannels() == 1 and reader.getsampwidth() == 2
    return np.frombuffer(frames, dtype="<i2"), rate


async def wait_until(predicate: Callable[[], bool], timeout: float = 2.0) -> float:
    """Seconds it took ``predicate`` to become true; fails the test after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition still false after {timeout} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start
