"""Real-time pacing of downlink Opus frames.

The device plays what it receives and drops frames when its 2.4 s queue is
full, so frames go out at playback speed with a small lead. The pacer keeps a
model of when the device's queued audio ends (`play_end`, monotonic clock):
each frame extends it by one frame, and a frame may leave once the device
would then hold at most `lead_frames` frames. The first frames of a turn
therefore go out at once (the pre-buffer), later ones one frame period apart.
When synthesis falls behind and the device runs dry, `play_end` restarts from
now (re-base): the missed time is not made up with a burst.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Pacer:
    def __init__(
        self,
        *,
        frame_s: float = 0.06,
        lead_frames: int = 5,
        not_before: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if frame_s <= 0:
            raise ValueError("frame_s must be positive")
        if lead_frames < 1:
            raise ValueError("lead_frames must be >= 1")
        self.frame_s = frame_s
        self.lead_s = lead_frames * frame_s
        self._clock = clock
        start = clock() if not_before is None else not_before
        self._not_before = start
        self._play_end: float | None = None
        self.frames = 0
        self.underruns = 0
        self.last_due: float | None = None

    def next_due(self) -> float:
        """Monotonic time at which the next frame may be sent."""
        now = self._clock()
        if self._play_end is None or self._play_end <= now:
            return max(now, self._not_before)
        return max(self._play_end + self.frame_s - self.lead_s, self._not_before)

    def mark_sent(self) -> None:
        """Account for one frame handed to the device."""
        now = self._clock()
        if self._play_end is None or self._play_end < now:
            if self._play_end is not None:
                self.underruns += 1
            self._play_end = max(now, self._not_before)
        self._play_end += self.frame_s
        self.frames += 1
        self.last_due = now

    async def wait_turn(self) -> None:
        """Sleep until the next frame is due (returns at once when it already is)."""
        delay = self.next_due() - self._clock()
        if delay > 0:
            await asyncio.sleep(delay)

    @property
    def play_end(self) -> float | None:
        """When the device will have played everything sent so far."""
        return self._play_end

    def stop_time(self, margin_s: float) -> float:
        """Earliest time for `tts stop`: the last frame's due time plus a margin."""
        if self.last_due is None:
            return self._clock()
        return self.last_due + margin_s
