"""When an uplink frame was captured, and where AEC3's reference is read for it.

`CaptureClock`: the capture time of an uplink frame comes from counting its
samples from an anchor (the arrival of the first frame less its duration); the
anchor is reset when arrivals drift away from the count (the device paused its
microphone).

`Aec3Alignment`: AEC3 is given the reference read `offset_ms` before the
frame's capture time (on our play-time model, gateway/aec/reference.py). AEC3
finds the rest of the delay itself, but only a delay >= 0 (its reference must
lead the echo) and up to ~500 ms.

* v2 timestamps: every downlink packet carries its play start; a server-AEC
  device copies the stamp of the packet it played into its next uplink
  packets, so `end of capture - stamp` (median of the last few) measures how
  late the device plays against our model. Where the measured delay says that
  leaves AEC3 a lag out of its range (a device that stamps the frame it starts
  to play), the reference moves to leave it AEC3_LAG_MS. Once the echo's move
  at a resume has been measured (`moved`), as without them.
* without: ASSUMED_LAG_MS until the delay is measured. Then AEC3 keeps the lag
  it had at the first measurement (moved to AEC3_LAG_MS where that was below
  AEC3_LAG_MIN_MS, the echo ahead of its reference: a device whose uplink frame
  carries what it starts playing, or above AEC3_LAG_MAX_MS), and the reference
  follows every later move of the measured delay: where the device's playback
  moved against our model (it resumed after a pause later or sooner than we
  did), AEC3's adapted filter still fits instead of leaking echo for seconds.

The reference is never read more than READ_AHEAD_MS past the capture: the
server has sent that much ahead (audio.prebuffer_frames 5: 240-300 ms).
"""

from __future__ import annotations

import statistics
from collections import deque

REANCHOR_MS = 250.0  # arrivals this far from the sample count: the stream restarted
# without timestamps, the echo is at least this late on our play-time model (a microphone frame
# leaves once captured; the network both ways): reading that much earlier spares AEC3 a search that
# made it leak echo 1-2 s into a first reply (bench, Opus uplink: false barge-ins in 3 of 40
# echo-only replies at 0 ms, none at 20)
ASSUMED_LAG_MS = 20.0
AEC3_LAG_MIN_MS = 10.0
AEC3_LAG_MAX_MS = 500.0  # AEC3 measured fine to 600
AEC3_LAG_MS = 40.0  # a lag out of range is moved to this
READ_AHEAD_MS = 120.0
SAMPLES_PER_MS = 16


class CaptureClock:
    def __init__(self) -> None:
        self._anchor_ms: float | None = None
        self._samples = 0

    def capture_time(self, samples: int, arrival_ms: float) -> float:
        """When the frame of `samples` that arrived at `arrival_ms` began to be captured."""
        duration = samples / SAMPLES_PER_MS
        if self._anchor_ms is not None:
            predicted = self._anchor_ms + self._samples / SAMPLES_PER_MS
            if abs(arrival_ms - duration - predicted) > REANCHOR_MS:
                self._anchor_ms = None
        if self._anchor_ms is None:
            self._anchor_ms = arrival_ms - duration
            self._samples = 0
        capture = self._anchor_ms + self._samples / SAMPLES_PER_MS
        self._samples += samples
        return capture


class Aec3Alignment:
    def __init__(self) -> None:
        self._offsets: deque[float] = deque(maxlen=9)  # end of capture - v2 timestamp, recent
        self._lag_ms: float | None = None  # v1: the lag AEC3 keeps once the delay is measured
        self._delay_ms: float | None = None  # v1: the measured delay the reference follows
        self._adjust_ms = 0.0  # v2: where the measured delay says the stamps mislead

    @property
    def stamped(self) -> bool:
        return bool(self._offsets)

    def note_stamp(self, capture_end_ms: float, timestamp_ms: int) -> None:
        """The v2 stamp of an uplink frame whose capture ended at `capture_end_ms`."""
        # timestamps are the low 32 bits of the session clock (ms)
        offset = (int(capture_end_ms) - timestamp_ms + (1 << 31)) % (1 << 32) - (1 << 31)
        if -1000 < offset < 2000:  # a stale or foreign stamp is ignored
            self._offsets.append(float(offset))

    @property
    def offset_ms(self) -> float:
        """AEC3's reference is read this long before the uplink frame's capture time."""
        if self._offsets and self._lag_ms is None:
            offset = statistics.median(self._offsets) + self._adjust_ms
        elif self._delay_ms is not None and self._lag_ms is not None:
            offset = self._delay_ms - self._lag_ms
        else:
            offset = ASSUMED_LAG_MS
        return max(offset, -READ_AHEAD_MS)

    def follow(self, delay_ms: float) -> None:
        """The echo's delay (absolute, measured) is now `delay_ms`."""
        lag = delay_ms - self.offset_ms
        in_range = AEC3_LAG_MIN_MS <= lag <= AEC3_LAG_MAX_MS
        if self._offsets and self._lag_ms is None:
            if not in_range:
                self._adjust_ms += lag - AEC3_LAG_MS
            return
        if self._lag_ms is None:
            self._lag_ms = lag if in_range else AEC3_LAG_MS
        self._delay_ms = delay_ms

    def moved(self, delay_ms: float, offset_ms: float) -> None:
        """The echo's move at a resume was measured from the echo itself (gateway/aec/shift.py),
        from `delay_ms` on: with v2 timestamps, from now on AEC3 keeps the lag it had and the
        reference follows the measured delay, as without them. The stamps name the packet
        playing, so they place the echo only to within a packet (60 ms): after a resume the
        device's frames and the uplink's fall in another phase, and their median moved by 1 ms
        where the echo moved by 51 (bench, stall-room-v2), leaving AEC3 to find the rest itself
        while it leaked echo for ~2 s. `offset_ms`: the offset where playback resumed (the median
        may have followed part of the move since: it must not count twice)."""
        if self._offsets and self._lag_ms is None:
            self._lag_ms = delay_ms - offset_ms
            self._delay_ms = delay_ms
