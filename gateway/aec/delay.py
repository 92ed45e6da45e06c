"""Echo delay estimation: where the reference's echo sits in the uplink.

GCC-PHAT (phase-transform-weighted cross-correlation, numpy's FFT) of the
last couple of seconds of uplink against the reference. The result is
absolute: the uplink's capture time less the reference's play time on our
model (gateway/aec/reference.py), whatever the canceller reads for AEC3.

Two-sided: the echo may sit up to `min_delay_ms` ahead of our model (a device
whose uplink frame carries what it starts playing, not what its microphone
captured: the independent test of issue 23), or up to `max_delay_ms` behind.
The reference is read when an estimate is made, not frame by frame as the
uplink arrives: what the server had not yet sent when a frame arrived has been
sent by then (reading it with the frame, at the start of every reply the first
frames read as silence).

The peak's lag is the delay; its height over the correlation's spread says
how sure the estimate is, and the reference at that lag must match the
uplink's waveform (`min_match`, a correlation coefficient): PHAT whitens
everything, so without that check the ±1 LSB an Opus decoder makes of
silence, or a user whose voice shares the reply's pitch (espeak-ng against
espeak-ng), gave confident nonsense. Through a room the echo is spread over
15-40 ms and matches less at any one lag: a match over a quarter of the bar
counts where the previous estimate agrees on the lag (WEAK_MATCH_SHARE). Runs every `every_s`, only while we play,
on 4 kHz signals (4-sample means): ~1 ms a run, 0.25 ms of resolution.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

RATE = 16000
DECIMATE = 4
SAMPLES_PER_MS = RATE // 1000
# the correlation around its peak that `shift_since` matches: the direct sound and a room's reflections
PROFILE_MS = (-50.0, 150.0)
MIN_PROFILE_MATCH = 0.6
MAX_SHIFT_MS = 500.0  # the farthest `shift_since` looks
MIC_FLOOR_RMS = 10.0  # an uplink this quiet (-70 dBFS) holds no echo worth measuring
REF_FLOOR_RMS = 30.0  # nothing playing: nothing to find
# a confident peak whose waveform match falls short, but over min_match / WEAK_MATCH_SHARE, counts where
# the previous estimate's peak was as confident at the same lag (to WEAK_AGREE_MS): a room's response
# spreads the echo over 15-40 ms, and at the direct sound's lag alone it matched 0.08-0.19 while the peak
# stood 18-20 times over the spread (bench legacy-v2: no estimate for 2.2 s of the first reply, a
# barge-in then missed); nonsense does not come back at the same lag to a quarter of a millisecond
WEAK_MATCH_SHARE = 4.0
WEAK_AGREE_MS = 0.5


class DelayEstimator:
    def __init__(
        self,
        read: Callable[[float, int], np.ndarray],
        *,
        window_s: float = 2.0,
        max_delay_ms: float = 1500.0,
        min_delay_ms: float = -120.0,
        every_s: float = 1.0,
        first_s: float | None = None,
        min_confidence: float = 8.0,
        min_match: float = 0.2,
    ) -> None:
        self._read = read  # (start ms on our play-time model, samples) -> int16 reference
        rate = RATE // DECIMATE
        self._window = int(window_s * rate)
        self._max_delay_ms = max_delay_ms
        self._span = int((max_delay_ms - min_delay_ms) * rate / 1000)  # lags searched, in 4 kHz samples
        self._every = int(every_s * rate)
        # the first estimates may come from less audio than a whole window (the linear stage waits for one)
        self._first = self._window if first_s is None else int(first_s * rate)
        self._min_confidence = min_confidence
        self._min_match = min_match
        self._mic: deque[np.ndarray] = deque()
        self._start_ms = 0.0  # capture time of the first held sample
        self._next_ms: float | None = None  # capture time the next frame should have
        self._held = 0
        self._since = 0
        self.delay_ms: float | None = None  # the last confident estimate
        self.profile: np.ndarray | None = None  # |correlation| of that estimate, per lag (4 kHz)
        self.estimates = 0
        self._weak_ms: float | None = None  # the last estimate's lag where only its match fell short

    def restart(self) -> None:
        """Measures again from the next frame on (the echo may have moved): the uplink held is
        forgotten, the last estimate kept; the next one comes after `first_s` of uplink."""
        self._mic.clear()
        self._held = self._since = 0
        self._next_ms = None
        self._weak_ms = None

    def push(self, mic: np.ndarray, capture_ms: float) -> float | None:
        """Adds one uplink frame captured from `capture_ms` on; returns a new confident estimate
        (ms, may be negative) when one is made."""
        if self._next_ms is not None and abs(capture_ms - self._next_ms) > 1.0:
            self._mic.clear()  # the capture clock was re-anchored: the held uplink is not contiguous
            self._held = 0
        if not self._mic:
            self._start_ms = capture_ms
        self._next_ms = capture_ms + mic.size / SAMPLES_PER_MS
        small = _decimate(mic)
        self._mic.append(small)
        self._held += small.size
        self._since += small.size
        while self._held - self._mic[0].size >= self._window:
            dropped = self._mic.popleft().size
            self._held -= dropped
            self._start_ms += dropped * DECIMATE / SAMPLES_PER_MS
        if self._since < self._every or self._held < self._first:
            return None
        self._since = 0
        return self._estimate()

    def _estimate(self) -> float | None:
        weak, self._weak_ms = self._weak_ms, None  # agreeing estimates follow one another
        mic = np.concatenate(self._mic)
        if np.sqrt(np.mean(mic**2)) < MIC_FLOOR_RMS:
            return None
        samples = (mic.size + self._span) * DECIMATE
        ref = _decimate(self._read(self._start_ms - self._max_delay_ms, samples))
        if np.sqrt(np.mean(ref**2)) < REF_FLOOR_RMS:
            return None
        n = 1 << int(np.ceil(np.log2(mic.size + ref.size)))
        cross = np.fft.rfft(ref, n) * np.conj(np.fft.rfft(mic, n))
        cross /= np.abs(cross) + 1e-9
        corr = np.fft.irfft(cross, n)[: self._span + 1]  # index j: the reference j samples after its start
        j = int(np.argmax(np.abs(corr)))
        confidence = float(np.abs(corr[j]) / (np.std(corr) + 1e-12))
        if confidence < self._min_confidence:
            return None
        echo = ref[j : j + mic.size]
        match = abs(float(np.dot(mic, echo))) / (float(np.linalg.norm(mic) * np.linalg.norm(echo)) + 1e-9)
        delay_ms = self._max_delay_ms - j * DECIMATE / SAMPLES_PER_MS
        if match < self._min_match:
            if match < self._min_match / WEAK_MATCH_SHARE:
                return None
            if weak is None or abs(weak - delay_ms) > WEAK_AGREE_MS:
                self._weak_ms = delay_ms
                return None
        self.delay_ms = delay_ms
        self.profile = np.abs(corr).astype(np.float32)
        self.estimates += 1
        return self.delay_ms

    def shift_since(self, profile: np.ndarray) -> float | None:
        """How far (ms, later positive) the echo moved from where an earlier estimate's `profile`
        put it to where the last one does, matching the correlation's shape around the earlier
        peak (direct sound and reflections) rather than comparing the highest peaks: in a room a
        reflection about as strong as the direct sound wins one estimate and loses the next, and
        a linear filter moved by that difference cancels nothing. None where the shapes differ."""
        if self.profile is None:
            return None
        rate = RATE // DECIMATE
        profile, current = _peaks(profile), _peaks(self.profile)
        peak = int(np.argmax(profile))
        lo = max(peak + int(PROFILE_MS[0] * rate / 1000), 0)
        hi = min(peak + int(PROFILE_MS[1] * rate / 1000), profile.size)
        template = profile[lo:hi] - profile[lo:hi].mean()
        m, size = template.size, current.size
        n = 1 << int(np.ceil(np.log2(size + m)))
        scores = np.fft.irfft(np.fft.rfft(current, n) * np.conj(np.fft.rfft(template, n)), n)
        scores = scores[: size - m + 1]  # index: where the template starts in the last profile
        sums = np.concatenate([[0.0], np.cumsum(current, dtype=np.float64)])
        squares = np.concatenate([[0.0], np.cumsum(current.astype(np.float64) ** 2)])
        window_sum = sums[m:] - sums[:-m]
        energy = squares[m:] - squares[:-m] - window_sum**2 / m  # of the profile less its window mean
        match = scores / (np.sqrt(np.maximum(energy, 1e-12)) * (np.linalg.norm(template) + 1e-12))
        reach = int(MAX_SHIFT_MS * rate / 1000)
        near = np.arange(max(lo - reach, 0), min(lo + reach, scores.size - 1) + 1)
        best = int(near[np.argmax(scores[near])])  # the strongest overlap, not a lone weak peak's shape
        if match[best] < MIN_PROFILE_MATCH:
            return None
        return -(best - lo) * DECIMATE / SAMPLES_PER_MS  # a later index is an earlier delay


def moved_profile(profile: np.ndarray, shift_ms: float) -> np.ndarray:
    """An estimate's `profile` with the echo `shift_ms` later (the anchor of `shift_since`)."""
    k = int(round(shift_ms * SAMPLES_PER_MS / DECIMATE))  # a later delay is an earlier index
    out = np.zeros_like(profile)
    if k >= 0:
        out[: profile.size - k] = profile[k:]
    else:
        out[-k:] = profile[: profile.size + k]
    return out


def _peaks(profile: np.ndarray) -> np.ndarray:
    """The correlation's peaks over its noise (~4 sigma: 6 times the median of |noise|)."""
    return np.maximum(profile - 6 * float(np.median(profile)), 0.0)


def _decimate(pcm: np.ndarray) -> np.ndarray:
    n = pcm.size // DECIMATE * DECIMATE
    return pcm[:n].astype(np.float32).reshape(-1, DECIMATE).mean(axis=1)
