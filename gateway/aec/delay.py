"""Echo delay estimation: where the reference's echo sits in the uplink.

GCC-PHAT (phase-transform-weighted cross-correlation, numpy's FFT) over the
last couple of seconds of uplink and the reference read at the same times.
The peak's lag is the delay; its height over the correlation's spread says
how sure the estimate is. Runs once a second, and only while we are playing,
on 4 kHz signals (4-sample means): ~1 ms a run instead of ~5 ms at 16 kHz,
and 0.25 ms of resolution is plenty.
"""

from __future__ import annotations

from collections import deque

import numpy as np

RATE = 16000
DECIMATE = 4


class DelayEstimator:
    def __init__(
        self,
        *,
        window_s: float = 2.0,
        max_delay_ms: float = 1500.0,
        every_s: float = 1.0,
        first_s: float | None = None,
        min_confidence: float = 8.0,
    ) -> None:
        rate = RATE // DECIMATE
        self._window = int(window_s * rate)
        self._max_lag = int(max_delay_ms * rate / 1000)
        self._every = int(every_s * rate)
        # the first estimates may come from less audio than a whole window (the linear stage waits for one)
        self._first = self._window if first_s is None else int(first_s * rate)
        self._min_confidence = min_confidence
        self._mic: deque[np.ndarray] = deque()
        self._ref: deque[np.ndarray] = deque()
        self._held = 0
        self._since = 0
        self.delay_ms: float | None = None  # the last confident estimate
        self.estimates = 0

    def reset(self) -> None:
        """Forgets the audio and the estimate (the reference was moved)."""
        self._mic.clear()
        self._ref.clear()
        self._held = self._since = 0
        self.delay_ms = None

    def push(self, mic: np.ndarray, ref: np.ndarray) -> float | None:
        """Adds one frame of each; returns a new confident estimate (ms) when one is made."""
        mic, ref = _decimate(mic), _decimate(ref)
        self._mic.append(mic)
        self._ref.append(ref)
        self._held += mic.size
        self._since += mic.size
        while self._held - self._mic[0].size >= self._window + self._max_lag:
            self._held -= self._mic.popleft().size
            self._ref.popleft()
        if self._since < self._every or self._held < self._first:
            return None
        self._since = 0
        return self._estimate()

    def _estimate(self) -> float | None:
        mic = np.concatenate(self._mic)
        ref = np.concatenate(self._ref)
        if np.sqrt(np.mean(ref[-self._window :] ** 2)) < 30:  # nothing playing: nothing to find
            return None
        n = 1 << int(np.ceil(np.log2(mic.size + ref.size)))
        cross = np.fft.rfft(mic, n) * np.conj(np.fft.rfft(ref, n))
        cross /= np.abs(cross) + 1e-9
        corr = np.fft.irfft(cross, n)[: self._max_lag + 1]  # mic lags ref: non-negative lags only
        lag = int(np.argmax(np.abs(corr)))
        confidence = float(np.abs(corr[lag]) / (np.std(corr) + 1e-12))
        if confidence < self._min_confidence:
            return None
        self.delay_ms = lag * 1000 * DECIMATE / RATE
        self.estimates += 1
        return self.delay_ms


def _decimate(pcm: np.ndarray) -> np.ndarray:
    n = pcm.size // DECIMATE * DECIMATE
    return pcm[:n].astype(np.float32).reshape(-1, DECIMATE).mean(axis=1)
