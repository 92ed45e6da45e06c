"""The last couple of seconds of a session's uplink, by capture time (canceller.py): what a new
linear stage warms up on (following.py), and what a shift search at a resume reads (resume.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np

from gateway.aec.reference import RATE, SAMPLES_PER_MS

WARM_UP_S = 2.0  # uplink kept to run a new linear stage over before it takes over


class RecentUplink:
    """The uplink frames, in order, that cover the last WARM_UP_S (the oldest may reach further back)."""

    def __init__(self) -> None:
        self._frames: deque[tuple[float, np.ndarray]] = deque()  # (capture ms, uplink pcm)
        self._samples = 0

    def __iter__(self) -> Iterator[tuple[float, np.ndarray]]:
        return iter(self._frames)

    def keep(self, capture_ms: float, pcm: np.ndarray) -> None:
        self._frames.append((capture_ms, pcm))
        self._samples += pcm.size
        while self._samples - self._frames[0][1].size >= WARM_UP_S * RATE:
            self._samples -= self._frames.popleft()[1].size

    def between(
        self, start_ms: float, end_ms: float, current: tuple[float, np.ndarray] | None = None
    ) -> np.ndarray | None:
        """The uplink captured from `start_ms` to `end_ms` (kept frames, and `current`); None where
        it does not reach back that far."""
        frames = list(self._frames) + ([current] if current is not None else [])
        if not frames or frames[0][0] > start_ms + 1.0 or end_ms <= start_ms:
            return None
        out = np.zeros(int(round((end_ms - start_ms) * SAMPLES_PER_MS)), np.int16)
        for frame_ms, frame in frames:
            at = int(round((frame_ms - start_ms) * SAMPLES_PER_MS))
            lo, hi = max(at, 0), min(at + frame.size, out.size)
            if hi > lo:
                out[lo:hi] = frame[lo - at : hi - at]
        return out
