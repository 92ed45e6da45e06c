"""A deterministic, cheap backend for tests and benchmarks: a harmonic tone whose length follows the text.

Each voice gets its own pitch (220 Hz for the first, then a quarter-tone of spacing per voice), so tests can
tell voices apart. ``compute_delay_s`` sleeps per chunk in the engine thread to emulate a slow model;
text containing ``fail_on`` makes ``next_chunk()`` raise after ``fail_after_chunks`` chunks; text
containing ``hang_on`` makes its first chunk take ``hang_s`` (a stuck engine step, for the stall tests).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from tts_engine.backends.base import Backend, BackendStream

_BASE_HZ = 220.0
_HARMONICS = ((1.0, 1.0), (2.0, 0.5), (3.0, 0.25))  # (multiple of f0, relative amplitude)
_AMPLITUDE = 0.3


@functools.lru_cache(maxsize=64)
def _tone_table(f0: float, sample_rate: int) -> np.ndarray:
    """One second of the tone (float32): the benchmark's 100 streams index it instead of
    computing sines per chunk. Whole seconds repeat exactly when f0 is a whole number of Hz;
    otherwise the phase jumps once a second, which is fine for a fake voice."""
    n = np.arange(sample_rate, dtype=np.float64)
    phase = (2.0 * math.pi * f0 / sample_rate) * n
    wave = np.zeros_like(phase)
    for mult, amp in _HARMONICS:
        wave += amp * np.sin(mult * phase)
    wave *= _AMPLITUDE / sum(amp for _, amp in _HARMONICS)
    table = wave.astype(np.float32)
    table.flags.writeable = False  # shared by every stream of this voice
    return table


_FADE_MS = 10.0


class FakeSynthesisError(RuntimeError):
    """Raised by a fake stream whose text contains the backend's ``fail_on`` marker."""


class FakeStream(BackendStream):
    def __init__(
        self,
        *,
        num_samples: int,
        sample_rate: int,
        chunk_samples: int,
        f0: float,
        delay_s: float,
        fail_at: int | None,
        on_close: Callable[[], None],
        hang_s: float = 0.0,
    ) -> None:
        self._hang_s = hang_s
        self._num_samples = num_samples
        self._sample_rate = sample_rate
        self._chunk_samples = chunk_samples
        self._f0 = f0
        self._delay_s = delay_s
        self._fail_at = fail_at
        self._num_fade = max(1, min(num_samples // 2, round(sample_rate * _FADE_MS / 1000)))
        self._pos = 0
        self._num_chunks = 0
        self._on_close: Callable[[], None] | None = on_close

    def next_chunk(self) -> np.ndarray | None:
        if self._fail_at is not None and self._num_chunks >= self._fail_at:
            raise FakeSynthesisError("text contains the fake backend's fail_on marker")
        if self._pos >= self._num_samples:
            return None
        if self._hang_s > 0:
            time.sleep(self._hang_s)
            self._hang_s = 0.0
        if self._delay_s > 0:
            time.sleep(self._delay_s)
        end = min(self._pos + self._chunk_samples, self._num_samples)
        n = np.arange(self._pos, end)
        table = _tone_table(self._f0, self._sample_rate)
        wave = table[n % table.size]
        # Linear fade in over the first samples and out over the last ones: no clicks at the edges.
        if self._pos < self._num_fade or end > self._num_samples - self._num_fade:
            fade = np.clip(np.minimum(n + 1, self._num_samples - n) / self._num_fade, 0.0, 1.0)
            wave = wave * fade.astype(np.float32)
        self._pos = end
        self._num_chunks += 1
        return wave

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


class FakeBackend(Backend):
    """Tone of ``max(1, len(text)) * ms_per_char / speed`` ms, delivered in ``chunk_ms`` chunks."""

    name = "fake"

    def __init__(
        self,
        sample_rate: int = 24000,
        *,
        chunk_ms: int = 200,
        ms_per_char: float = 80.0,
        compute_delay_s: float = 0.0,
        fail_on: str | None = None,
        fail_after_chunks: int = 0,
        voices: Sequence[str] = ("default",),
        hang_on: str | None = None,
        hang_s: float = 0.0,
    ) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        if chunk_ms <= 0:
            raise ValueError(f"chunk_ms must be positive, got {chunk_ms}")
        if ms_per_char <= 0:
            raise ValueError(f"ms_per_char must be positive, got {ms_per_char}")
        if compute_delay_s < 0:
            raise ValueError(f"compute_delay_s must be >= 0, got {compute_delay_s}")
        if fail_after_chunks < 0:
            raise ValueError(f"fail_after_chunks must be >= 0, got {fail_after_chunks}")
        if isinstance(voices, str) or not voices:
            raise ValueError("voices must be a non-empty sequence of names")
        if fail_on == "" or hang_on == "":
            raise ValueError("fail_on and hang_on must be None or a non-empty string")
        if hang_s < 0:
            raise ValueError(f"hang_s must be >= 0, got {hang_s}")
        self.hang_on = hang_on
        self.hang_s = hang_s
        self.sample_rate = sample_rate
        self.chunk_ms = chunk_ms
        self.ms_per_char = ms_per_char
        self.compute_delay_s = compute_delay_s
        self.fail_on = fail_on
        self.fail_after_chunks = fail_after_chunks
        self._voices = list(voices)
        self.default_voice = self._voices[0]
        self.closed = False
        self.num_streams_opened = 0
        self.num_streams_closed = 0

    def voices(self) -> list[str]:
        return list(self._voices)

    def num_samples_for(self, text: str, speed: float = 1.0) -> int:
        """How many samples ``text`` produces at ``speed``."""
        return round(max(1, len(text)) * self.ms_per_char / speed * self.sample_rate / 1000)

    def open_stream(self, text: str, voice: str, speed: float, instruct: str | None = None) -> FakeStream:
        """``instruct`` is never passed (no ``supports_instruct``); the signature is the contract's."""
        if voice not in self._voices:
            raise ValueError(f"unknown voice {voice!r}")
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        f0 = _BASE_HZ * 2.0 ** (self._voices.index(voice) / 24)
        fails = self.fail_on is not None and self.fail_on in text
        stream = FakeStream(
            num_samples=self.num_samples_for(text, speed),
            sample_rate=self.sample_rate,
            chunk_samples=max(1, round(self.sample_rate * self.chunk_ms / 1000)),
            f0=f0,
            delay_s=self.compute_delay_s,
            fail_at=self.fail_after_chunks if fails else None,
            on_close=self._count_closed,
            hang_s=self.hang_s if self.hang_on is not None and self.hang_on in text else 0.0,
        )
        self.num_streams_opened += 1
        return stream

    def _count_closed(self) -> None:
        self.num_streams_closed += 1

    def close(self) -> None:
        self.closed = True
