"""Per-session echo canceller: uplink PCM in, uplink PCM with our reply's echo removed out.

The cancelling itself is done by libraries (stages.py): WebRTC's AEC3 through
`livekit` (why that binding: stages.py), and SpeexDSP's linear filter beside it
(speex.py). While a reply plays AEC3 costs ~1.2 % of a core per session, with
the linear stage ~1.8 % (scripts/bench_aec.py), so it runs on the event loop.

Alignment: each uplink frame is given the reference that the device played
when the frame was captured.

* v2 timestamps: every downlink packet carries its play start (ms on the
  session clock); a server-AEC device copies the timestamp of the packet it
  just played into its next uplink packets, so `end of capture - timestamp`
  measures how late the device plays against our model (median of the last few).
* otherwise (v1/v3, or a device that stamps nothing): the reference is read
  ASSUMED_LAG_MS before the frame's capture time, and `DelayEstimator` measures
  the echo delay; a delay past what AEC3 covers comfortably shifts the reference.

The capture time of an uplink frame comes from counting its samples from an
anchor (the arrival of the first frame less its duration); the anchor is reset
when arrivals drift away from the count (the device paused its microphone).

Double talk (`linear=True`, config `asr.aec_double_talk`, on by default):
AEC3's suppressor takes 20-40 dB off the first 100-150 ms of speech that is
about as loud as the echo, so the VAD can miss a barge-in. Once
`DelayEstimator` has measured the delay (a first estimate from 0.5 s of the
first reply), a linear stage (stages.LinearStage: SpeexDSP's filter on the
reference pre-aligned by that delay, first run 3 times over the last couple of
seconds of uplink so that it starts converged) runs beside AEC3; where its echo
estimate shows the user talking, its output replaces AEC3's for that 10 ms.
AEC3's own path is unchanged. Until the stage shows it converged it is rebuilt
at each new estimate (every 0.5 s, more audio each time: converged ~1.5-2 s
into the first reply); after that only for a move two estimates agree on.
Where the reference resumes after a pause in playback, the stage is told to
doubt its filter (stages.LinearStage.doubt).

Early guard (with the linear stage): AEC3 can leak echo ~0.8-1.7 s into a
session's first reply, only ~10 dB under the microphone (bench, --seed 1: a
false barge-in at 1.4 s). For the first GUARD_S of reply played, a 10 ms chunk
that the stage does not take for talk and whose microphone peak is no louder
than the echo path usually makes of the reference's recent peak (Geigel,
stages.LinearStage.echo_like) is muted: there it can only be echo. Speech
louder than the echo passes, and so does all that the stage takes for talk.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np

from gateway.aec.delay import DelayEstimator
from gateway.aec.reference import RATE, SAMPLES_PER_MS, EchoReference
from gateway.aec.stages import CHUNK, LEAD_MS, Aec3, LinearStage

log = logging.getLogger(__name__)

REANCHOR_MS = 250.0  # arrivals this far from the sample count: the stream restarted
SHIFT_ABOVE_MS = 500.0  # estimated delays beyond this shift the reference (AEC3 measured fine to 600)
SHIFT_MARGIN_MS = 60.0  # ... leaving AEC3 this much delay to find itself
# without timestamps, the echo is at least this late on our play-time model (the device's output
# buffers, the network both ways): reading the reference this much earlier spares AEC3 a search
# that made it leak echo 1-2 s into a first reply (bench, Opus uplink: false barge-ins in 3 of
# 40 echo-only replies at 0 ms, none at 20)
ASSUMED_LAG_MS = 20.0
GUARD_S = 2.0  # AEC3 may leak echo this early in a session (s of reply played): the early guard
ACTIVE_RMS = 50.0  # a reference frame this loud counts towards ERLE
CONVERGE_S = 1.0  # reference playing this long before ERLE counts
REALIGN_MS = 15.0  # a delay estimate this far from the linear stage's alignment rebuilds it
WARM_UP_S = 2.0  # uplink kept to run a new linear stage over before it takes over
WARM_UP_PASSES = 3  # ... this many times over (stages.LinearStage.warm_up)
EARLY_REBUILDS = 4  # an unconverged linear stage is rebuilt at each new estimate, this many times
AGREE_MS = 5.0  # a converged stage moves only for two estimates this close to each other


@dataclass
class EchoStats:
    erle_db: float | None
    delay_ms: float | None
    frames: int
    aligned_by_timestamps: bool


class EchoCanceller:
    def __init__(self, reference: EchoReference, *, linear: bool = False) -> None:
        self.reference = reference
        # the linear stage waits for the delay: a first estimate after 1.5 s instead of 2
        self.delay = DelayEstimator(window_s=1.5, every_s=0.5, first_s=0.5) if linear else DelayEstimator()
        self._use_linear = linear
        self._aec3 = Aec3()
        self._linear: LinearStage | None = None  # once the delay is measured
        self._rebuilds = 0
        self._last_estimate: float | None = None
        self._recent: deque[tuple[float, np.ndarray]] = deque()  # (capture ms, uplink pcm) to warm up on
        self._recent_samples = 0
        self._anchor_ms: float | None = None
        self._samples = 0
        self._offsets: deque[float] = deque(maxlen=9)  # capture time - v2 timestamp, recent
        self._shift_ms = ASSUMED_LAG_MS
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
        if timestamp_ms:  # the stamp of the packet playing as the frame's capture ended
            self._note_timestamp(capture_ms + pcm.size / SAMPLES_PER_MS, timestamp_ms)
        ref_start = capture_ms - self._offset_ms()
        ref = self.reference.read(ref_start, pcm.size)
        out = self._aec3.run(pcm, ref)
        if self._linear is not None:
            # the stage's alignment is absolute (base offset + delay when built): a v2 median that
            # moves by a few ms must not move the reference under an adapted filter
            aligned_ms = capture_ms - self._linear.delay_ms + LEAD_MS
            if self._resumed_in(aligned_ms, aligned_ms + pcm.size / SAMPLES_PER_MS):
                self._linear.doubt()  # the device's pause may have differed: the echo may have moved
            aligned = self.reference.read(aligned_ms, pcm.size)
            ran = self._linear.run(pcm, aligned)  # None: nothing played lately
            if ran is not None:  # where the user talks, the linear output has them whole
                linear, double_talk = ran
                for k in np.flatnonzero(double_talk):
                    out[k * CHUNK : (k + 1) * CHUNK] = linear[k * CHUNK : (k + 1) * CHUNK]
                if self._active_s < GUARD_S:
                    for k in np.flatnonzero(self._linear.echo_like()):
                        out[k * CHUNK : (k + 1) * CHUNK] = 0
        self.frames += 1
        self._account(pcm, ref, out)
        if self._use_linear:
            self._keep(capture_ms, pcm)
        estimate = self.delay.push(pcm, ref)
        if estimate is not None and not self._offsets and estimate > SHIFT_ABOVE_MS:
            self._shift_ms += estimate - SHIFT_MARGIN_MS
            self.delay.reset()  # its audio was read at the old alignment
            self._linear = None  # ... and so was the linear stage's
        elif self._use_linear and estimate is not None:
            estimate += self._offset_ms()  # absolute: from our play-time model to the uplink
            if self._moves_linear(estimate):
                self._realign(estimate)
            self._last_estimate = estimate
        return out

    def _resumed_in(self, start_ms: float, end_ms: float) -> bool:
        return any(start_ms <= t < end_ms for t in self.reference.resumes)

    def _moves_linear(self, estimate: float) -> bool:
        """Whether a new delay estimate rebuilds the linear stage.

        Before it has converged: at each estimate (more audio, more passes), a few times.
        Once converged: only for a move of REALIGN_MS that two estimates agree on, so that an
        estimate thrown by the user's own speech does not throw away a working filter.
        """
        stage = self._linear
        if stage is None or (not stage.converged and self._rebuilds < EARLY_REBUILDS):
            return True
        last = self._last_estimate
        return (
            abs(estimate - stage.delay_ms) >= REALIGN_MS
            and last is not None
            and abs(estimate - last) < AGREE_MS
        )

    def _keep(self, capture_ms: float, pcm: np.ndarray) -> None:
        self._recent.append((capture_ms, pcm))
        self._recent_samples += pcm.size
        while self._recent_samples - self._recent[0][1].size >= WARM_UP_S * RATE:
            self._recent_samples -= self._recent.popleft()[1].size

    def _realign(self, delay_ms: float) -> None:
        """A linear stage aligned to `delay_ms`, run over the recent uplink, takes over."""
        stage = LinearStage.create(delay_ms)
        if stage is None:
            self._use_linear = False
            return
        frames = [
            (pcm, self.reference.read(capture_ms - delay_ms + LEAD_MS, pcm.size))
            for capture_ms, pcm in self._recent
        ]
        stage.warm_up(frames, WARM_UP_PASSES)
        self._linear = stage
        self._rebuilds += 1
        log.debug("echo canceller's linear stage aligned to %.1f ms", delay_ms)

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
        return statistics.median(self._offsets) if self._offsets else self._shift_ms

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
    def aligned(self) -> bool:
        """The echo's delay is measured and the reference pre-aligned by it (see the module doc)."""
        return self._linear is not None

    @property
    def delay_ms(self) -> float | None:
        """Estimated delay from our play-time model to the echo in the uplink."""
        return None if self.delay.delay_ms is None else self._offset_ms() + self.delay.delay_ms

    def stats(self) -> EchoStats:
        return EchoStats(self.erle_db, self.delay_ms, self.frames, bool(self._offsets))
