"""Per-session echo canceller: uplink PCM in, uplink PCM with our reply's echo removed out.

Library choice: `livekit` (its `rtc.AudioProcessingModule` wraps WebRTC's audio
processing module with AEC3). It installs as a manylinux wheel on Python 3.11
x86-64 and runs locally, no LiveKit server involved. `aec-audio-processing`
ships only an sdist (needs a C++ toolchain at install), and speexdsp's
canceller is older and weaker at double talk. AEC3 works in 10 ms frames at
16 kHz, estimates the residual delay itself (measured fine from 40 to 600 ms)
and costs ~0.07 ms per 10 ms on one core, so it runs on the event loop
(~0.5 ms per 60 ms uplink frame; see scripts/bench_aec.py).

Alignment: each uplink frame is given the reference that the device played
when the frame was captured.

* v2 timestamps: every downlink packet carries its play start (ms on the
  session clock); a server-AEC device copies the timestamp of the packet it
  just played into its next uplink packets, so `capture time - timestamp`
  measures how late the device plays against our model (median of the last few).
* otherwise (v1/v3, or a device that stamps nothing): the reference is read at
  the frame's capture time, and `DelayEstimator` measures the echo delay; a
  delay past what AEC3 covers comfortably shifts the reference.

The capture time of an uplink frame comes from counting its samples from an
anchor (the arrival of the first frame less its duration); the anchor is reset
when arrivals drift away from the count (the device paused its microphone).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np
from livekit import rtc

from gateway.aec.delay import DelayEstimator
from gateway.aec.reference import RATE, SAMPLES_PER_MS, EchoReference

CHUNK = RATE // 100  # AEC3 takes 10 ms frames
REANCHOR_MS = 250.0  # arrivals this far from the sample count: the stream restarted
SHIFT_ABOVE_MS = 500.0  # estimated delays beyond this shift the reference (AEC3 measured fine to 600)
SHIFT_MARGIN_MS = 60.0  # ... leaving AEC3 this much delay to find itself
ACTIVE_RMS = 50.0  # a reference frame this loud counts towards ERLE
CONVERGE_S = 1.0  # reference playing this long before ERLE counts


@dataclass
class EchoStats:
    erle_db: float | None
    delay_ms: float | None
    frames: int
    aligned_by_timestamps: bool


class EchoCanceller:
    def __init__(self, reference: EchoReference) -> None:
        self.reference = reference
        self._apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)
        self.delay = DelayEstimator()
        self._anchor_ms: float | None = None
        self._samples = 0
        self._offsets: deque[float] = deque(maxlen=9)  # capture time - v2 timestamp, recent
        self._shift_ms = 0.0
        self._active_s = 0.0
        self._mic_energy = 0.0
        self._out_energy = 0.0
        self.frames = 0

    # ---- processing --------------------------------------------------------------

    def process(self, pcm: np.ndarray, arrival_ms: float, timestamp_ms: int = 0) -> np.ndarray:
        """Cleans one uplink frame (int16, 16 kHz); a trailing part under 10 ms passes as it is."""
        pcm = np.asarray(pcm, np.int16)
        if not pcm.size:
            return pcm
        capture_ms = self._capture_time(pcm.size, arrival_ms)
        if timestamp_ms:
            self._note_timestamp(capture_ms, timestamp_ms)
        ref_start = capture_ms - self._offset_ms()
        ref = self.reference.read(ref_start, pcm.size)
        out = pcm.copy()
        for i in range(0, pcm.size - CHUNK + 1, CHUNK):
            far = rtc.AudioFrame(ref[i : i + CHUNK].tobytes(), RATE, 1, CHUNK)
            self._apm.process_reverse_stream(far)
            near = rtc.AudioFrame(pcm[i : i + CHUNK].tobytes(), RATE, 1, CHUNK)
            self._apm.set_stream_delay_ms(0)  # AEC3 estimates the delay itself
            self._apm.process_stream(near)
            out[i : i + CHUNK] = np.frombuffer(near.data, np.int16)
        self.frames += 1
        self._account(pcm, ref, out)
        estimate = self.delay.push(pcm, ref)
        if estimate is not None and not self._offsets and estimate > SHIFT_ABOVE_MS:
            self._shift_ms += estimate - SHIFT_MARGIN_MS
            self.delay.reset()  # its audio was read at the old alignment
        return out

    def _capture_time(self, samples: int, arrival_ms: float) -> float:
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

    def _note_timestamp(self, capture_ms: float, timestamp_ms: int) -> None:
        # timestamps are the low 32 bits of the session clock (ms)
        offset = (int(capture_ms) - timestamp_ms) % (1 << 32)
        if offset < 2000:  # a stale or foreign stamp is ignored
            self._offsets.append(float(offset))

    def _offset_ms(self) -> float:
        if self._offsets:
            return statistics.median(self._offsets)
        return self._shift_ms

    # ---- figures -----------------------------------------------------------------

    def _account(self, mic: np.ndarray, ref: np.ndarray, out: np.ndarray) -> None:
        if np.sqrt(np.mean(ref.astype(np.float64) ** 2)) < ACTIVE_RMS:
            return
        self._active_s += ref.size / RATE
        if self._active_s <= CONVERGE_S:
            return
        self._mic_energy += float(np.sum(mic.astype(np.float64) ** 2))
        self._out_energy += float(np.sum(out.astype(np.float64) ** 2))

    @property
    def erle_db(self) -> float | None:
        """Echo return loss enhancement over the frames with our reply playing, after convergence."""
        if self._mic_energy <= 0:
            return None
        return 10 * np.log10(self._mic_energy / max(self._out_energy, 1.0))

    @property
    def delay_ms(self) -> float | None:
        """Estimated delay from our play-time model to the echo in the uplink."""
        base = statistics.median(self._offsets) if self._offsets else self._shift_ms
        return None if self.delay.delay_ms is None else base + self.delay.delay_ms

    def stats(self) -> EchoStats:
        return EchoStats(self.erle_db, self.delay_ms, self.frames, bool(self._offsets))
