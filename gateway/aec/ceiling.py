"""How loud the echo can be in each 10 ms chunk of uplink, learnt without knowing its delay.

Why: AEC3's suppressor models the echo as what its linear filter predicts once
that filter has converged, and before, as the reference's power times a default
gain. With little or no echo (a device that cancels its own, headphones, a
quiet loudspeaker) its filter has nothing to converge on, so it keeps ducking
whatever the microphone hears while we play: speech 4 s into a reply lost its
first 250 ms by 75 dB and the VAD found the user 0.6-2 s late, or not at all.
The linear stage (stages.py) cannot tell talk from echo without echo either.

The bound: for any stretch of uplink (WINDOW_S), the echo path's energy gain is
at most E(uplink) / min over delays D of E(reference, D earlier), since the
echo is all there while we play and the user only sometimes; the quietest
window of the last KEEP_S (the user silent) gives the tightest bound. It falls
at most DROP_DB per window hop (a device whose buffer ran dry played nothing
for a while, so that echo comes back above a bound learnt meanwhile) and rises
when the quiet windows age out (the device turned up). Delays range over
MIN_DELAY_MS..MAX_DELAY_MS (later once the delay is measured later): before the
reference has played that long the bound is unknown.

Per chunk the echo can be at most gain × the loudest reference chunk over that
delay range: `push` returns that power. Far above it (TALK_DB) the chunk is the
user, whatever AEC3 makes of it; at or below it (ECHO_DB) it may be echo.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

RATE = 16000
CHUNK = RATE // 100
SAMPLES_PER_MS = RATE // 1000
MIN_DELAY_MS = -120.0  # echo ahead of our play-time model (gateway/aec/delay.py)
MAX_DELAY_MS = 800.0  # ... behind it, unless the delay is measured later
TAIL_MS = 400.0  # a room's echo lasts this long after its direct sound
WINDOW_S = 0.75
HOP_S = 0.25
KEEP_S = 5.0
DROP_DB = 1.5
REF_FLOOR = 100.0**2  # a window whose reference is this quiet at some delay bounds nothing
TALK_DB = 10.0
ECHO_DB = 3.0


class EchoCeiling:
    def __init__(self, read: Callable[[float, int], np.ndarray]) -> None:
        self._read = read  # (start ms on our play-time model, samples) -> int16 reference
        self._window = int(WINDOW_S * 100)
        self._hop = int(HOP_S * 100)
        self._powers: deque[float] = deque(maxlen=self._window)  # uplink chunk powers, latest window
        self._end_ms: float | None = None  # capture time after the last chunk held
        self._since = 0
        self._ratios: deque[tuple[float, float]] = deque()  # (capture ms, window's bound on gain²)
        self._max_delay_ms = MAX_DELAY_MS
        self.gain2: float | None = None  # the bound on the echo path's energy gain

    def measured_delay(self, delay_ms: float) -> None:
        """A measured echo delay later than MAX_DELAY_MS widens the range."""
        self._max_delay_ms = max(MAX_DELAY_MS, delay_ms + TAIL_MS)

    def push(self, powers: np.ndarray, capture_ms: float) -> np.ndarray:
        """Takes the power (mean square) of each 10 ms chunk of an uplink frame captured from
        `capture_ms` on; returns per chunk the most the echo can be: the gain bound (0 dB while
        it is unknown) times the loudest reference chunk over the delay range."""
        chunks = powers.size
        if not chunks:
            return np.zeros(0)
        if self._end_ms is not None and abs(capture_ms - self._end_ms) > 1.0:
            self._powers.clear()  # the capture clock was re-anchored
            self._since = 0
        self._end_ms = capture_ms + chunks * 10.0
        for k, power in enumerate(powers):
            self._powers.append(float(power))
            self._since += 1
            if self._since >= self._hop and len(self._powers) == self._window:
                self._since = 0
                self._learn(capture_ms + (k + 1) * 10.0)
        return (1.0 if self.gain2 is None else self.gain2) * self.loudest(capture_ms, chunks)

    def loudest(self, capture_ms: float, chunks: int) -> np.ndarray:
        """Per chunk from `capture_ms` on: the loudest reference chunk's power over the delay range."""
        span = int((self._max_delay_ms - MIN_DELAY_MS) / 10)
        ref = self._reference_powers(capture_ms - self._max_delay_ms, chunks + span)
        windows = np.lib.stride_tricks.sliding_window_view(ref, span + 1)
        return windows.max(axis=1)

    def _learn(self, end_ms: float) -> None:
        start_ms = end_ms - self._window * 10.0
        span = int((self._max_delay_ms - MIN_DELAY_MS) / 10)
        ref = self._reference_powers(start_ms - self._max_delay_ms, self._window + span)
        sums = np.convolve(ref, np.ones(self._window), mode="valid")  # one per delay
        quietest = float(sums.min()) / self._window
        if quietest < REF_FLOOR:
            return
        self._ratios.append((end_ms, float(np.mean(self._powers)) / quietest))
        while self._ratios[0][0] < end_ms - KEEP_S * 1000:
            self._ratios.popleft()
        bound = min(ratio for _, ratio in self._ratios)
        if self.gain2 is not None:
            bound = max(bound, self.gain2 * 10 ** (-DROP_DB / 10))
        self.gain2 = bound

    def _reference_powers(self, start_ms: float, chunks: int) -> np.ndarray:
        ref = self._read(start_ms, chunks * CHUNK).astype(np.float64)
        return np.mean(ref.reshape(chunks, CHUNK) ** 2, axis=1)
