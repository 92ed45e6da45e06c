"""Per-session echo canceller: uplink PCM in, uplink PCM with our reply's echo removed out.

The cancelling itself is done by libraries (stages.py): WebRTC's AEC3 through
`livekit` (why that binding: stages.py), and SpeexDSP's linear filter beside it
(speex.py). While a reply plays it all costs ~2.5 % of a core per session
(scripts/bench_aec.py), so it runs on the event loop.

Alignment (alignment.py): each uplink frame gets a capture time (sample count
from an anchor), and AEC3 the reference read an offset before it: from the v2
timestamps, or without them ASSUMED_LAG_MS until `DelayEstimator` has measured
the delay. The estimate is absolute (our play-time model to the uplink) and
two-sided: a device whose uplink frame carries the frame it starts to play
(issue 23's test of xiaozhi-sdk) puts its echo up to a frame ahead of our
model, where AEC3 cannot cancel it; the reference then moves to leave AEC3 a
lag it can handle.

Double talk (`linear=True`, config `asr.aec_double_talk`, on by default):
AEC3's suppressor takes 20-40 dB off the first 100-150 ms of speech that is
about as loud as the echo, so the VAD can miss a barge-in. A linear stage
(linear.LinearStage: SpeexDSP's filter on the reference pre-aligned by the
measured delay, first run 3 times over the last couple of seconds of uplink)
runs beside AEC3; where its echo estimate shows the user talking, its output
replaces AEC3's for that 10 ms. How it follows the delay, is rebuilt and moved:
following.py.

The echo moves where playback resumes after running dry (the device's pause
may have differed from ours) or where a device runs dry on its own: resume.py
(the move measured from the stage's own echo path while the stage waits, talk
before the resume that the resumed echo may be), else following.py (the delay
measured again on what follows the resume).

What goes on per 10 ms chunk (guard.py): AEC3's output; the user's words whole
where the stage shows them talking or they are far above how loud the echo can
be (ceiling.py); nothing where AEC3 may leak echo (the guards).

The parts: `EchoCanceller` (here: a frame's path through them) is made of
`DelayFollowing` (following.py) and `ResumeHandling` (resume.py), and holds an
`EchoGuard` (guard.py), the `RecentUplink` (uplink.py) and its `EchoFigures`
(figures.py: ERLE, `EchoStats`).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from gateway.aec.alignment import Aec3Alignment, CaptureClock
from gateway.aec.ceiling import EchoCeiling
from gateway.aec.delay import DelayEstimator
from gateway.aec.figures import ACTIVE_RMS, CONVERGE_S, EchoFigures, EchoStats
from gateway.aec.following import (
    AGREE_MS,
    EARLY_REBUILDS,
    MOVE_MS,
    SMALL_MOVE_MS,
    WARM_UP_PASSES,
    DelayFollowing,
)
from gateway.aec.guard import ECHO, GUARD_S, LEAK, LEAK_CHUNKS, LOUD_RMS, RESUME_GUARD_S, TALK, EchoGuard
from gateway.aec.linear import LEAD_MS, LinearStage
from gateway.aec.reference import SAMPLES_PER_MS, EchoReference
from gateway.aec.resume import CALIBRATE_S, SHIFT_GIVE_UP_S, ResumeHandling
from gateway.aec.shift import MIN_SHIFT_MS, ShiftFinder
from gateway.aec.stages import Aec3
from gateway.aec.uplink import WARM_UP_S, RecentUplink

__all__ = [  # the canceller's tuning, defined beside the parts that use it, importable from here too
    "ACTIVE_RMS",
    "AGREE_MS",
    "CALIBRATE_S",
    "CONVERGE_S",
    "EARLY_REBUILDS",
    "ECHO",
    "GUARD_S",
    "LEAK",
    "LEAK_CHUNKS",
    "LOUD_RMS",
    "MOVE_MS",
    "RESUME_FIRST_S",
    "RESUME_GUARD_S",
    "SHIFT_GIVE_UP_S",
    "SMALL_MOVE_MS",
    "TALK",
    "WARM_UP_PASSES",
    "WARM_UP_S",
    "EchoCanceller",
    "EchoStats",
]

RESUME_FIRST_S = 0.5  # after a resume, a new estimate from this much uplink after it


class EchoCanceller(DelayFollowing, ResumeHandling):
    def __init__(self, reference: EchoReference, *, linear: bool = False) -> None:
        self.reference = reference
        read = reference.read
        # the linear stage waits for the delay: a first estimate after 0.5 s, then every 0.5 s
        self.delay = (
            DelayEstimator(read, window_s=1.5, every_s=0.5, first_s=RESUME_FIRST_S)
            if linear
            else DelayEstimator(read, first_s=RESUME_FIRST_S)
        )
        self._use_linear = linear
        self._aec3 = Aec3()
        self._alignment = Aec3Alignment()
        self._clock = CaptureClock()
        self._ceiling = EchoCeiling(read)
        self._guard = EchoGuard(self._ceiling)  # what goes on per chunk; mutes what may be echo
        self._linear: LinearStage | None = None  # once the delay is measured
        self._finder: ShiftFinder | None = None  # measuring the echo's move at a resume (the stage waits)
        self._waiting_from_ms = 0.0  # capture time of the first frame the stage waits on
        self._shifted: deque[float] = deque(maxlen=8)  # resumes whose move the finder measured
        self._doubted_at: deque[float] = deque(maxlen=8)  # resumes at which the stage was doubted
        self._talking = False  # the stage's last chunk was talk
        self._offset_at_resume = 0.0  # AEC3's reference offset where its reference resumed
        self._move: tuple[float, float] | None = None  # the last: (resume, the stage's delay before it)
        self._rebuilds = 0
        self._accepted_ms: float | None = None  # the delay the stage and AEC3's reference follow
        self._anchor: np.ndarray | None = None  # the estimator's profile where it was accepted
        self._last_shift: float | None = None
        self._resumed = False  # playback resumed since the last estimate
        self._restarted_ms = 0.0  # capture time from which the delay is measured again
        self._recent = RecentUplink()  # (capture ms, uplink pcm) to warm up on
        self._figures = EchoFigures()
        self.frames = 0

    # ---- processing --------------------------------------------------------------

    def process(self, pcm: np.ndarray, arrival_ms: float, timestamp_ms: int = 0) -> np.ndarray:
        """Cleans one uplink frame (int16, 16 kHz); a trailing part under 10 ms passes as it is."""
        pcm = np.asarray(pcm, np.int16)
        if not pcm.size:
            return pcm
        capture_ms = self._clock.capture_time(pcm.size, arrival_ms)
        duration_ms = pcm.size / SAMPLES_PER_MS
        if timestamp_ms:  # the stamp of the packet playing as the frame's capture ended
            self._alignment.note_stamp(capture_ms + duration_ms, timestamp_ms)
        ref_start = capture_ms - self._alignment.offset_ms
        ref = self.reference.read(ref_start, pcm.size)
        out = self._aec3.run(pcm, ref)
        if self._resumed_in(ref_start, ref_start + duration_ms):
            # the device's pause may have differed from ours: the echo may have moved. Mute what may be
            # echo for a while, and measure the delay again on what follows the resume alone.
            self._guard.restart(capture_ms)
            self._offset_at_resume = self._alignment.offset_ms  # before the stamps follow the move
            if self._accepted_ms is None:
                self._restart_delay(capture_ms)
        if self._accepted_ms is not None:
            echo_ms = capture_ms - self._accepted_ms  # where the echo in this frame was played
            if self._resume_in(echo_ms - LEAD_MS, echo_ms - LEAD_MS + duration_ms) is not None:
                self._restart_delay(capture_ms)
        ran = None
        if self._linear is not None:
            # the stage's alignment is absolute: a v2 median that moves by a few ms must not move
            # the reference under an adapted filter
            aligned_ms = capture_ms - self._linear.delay_ms + LEAD_MS
            resumed = self._stage_resume_in(aligned_ms, aligned_ms + duration_ms)
            # the echo after a resume may come back up to -MIN_SHIFT_MS sooner than the stage
            # expects it, and to the stage it is then talk: before the resume only talk that had
            # begun before counts (new talk waits for the finder)
            end_ms = aligned_ms + duration_ms
            ahead = self._stage_resume_in(end_ms, end_ms - MIN_SHIFT_MS)
            if resumed is not None and self._finder is None:
                self._doubted_at.append(resumed)
                self._search_shift(resumed, capture_ms)
                self._linear.doubt()
            if self._finder is not None:
                ran = self._find_shift(pcm, capture_ms)  # None while it searches: the stage waits
            else:
                ran = self._linear.run(
                    pcm, self._stage_reference(capture_ms, pcm.size)
                )  # None: nothing played
            if ran is not None and ahead is not None:
                ran = self._before_resume(ran, pcm, ahead)
            if self._linear.slipped:  # the device's playback moved: as after a resume
                self._linear.doubt()
                self._guard.restart(capture_ms)
                self._restart_delay(capture_ms)
        self._talking = ran is not None and bool(ran[1][-1:].any())
        out = self._guard.choose(pcm, capture_ms, out, ran, self._linear, self._figures.active_s)
        self.frames += 1
        self._figures.account(pcm, ref, out)
        if self._use_linear:
            self._recent.keep(capture_ms, pcm)
        estimate = self.delay.push(pcm, capture_ms)  # absolute: from our play-time model to the uplink
        if estimate is not None:
            self._on_estimate(estimate)
        return out

    # ---- figures -----------------------------------------------------------------

    @property
    def guarding(self) -> bool:
        """The last frame muted what may only be echo (AEC3 may leak)."""
        return self._guard.guarding

    @property
    def erle_db(self) -> float | None:
        """Echo return loss enhancement over the frames with our reply playing, after convergence."""
        return self._figures.erle_db

    @property
    def aligned(self) -> bool:
        """The echo's delay is measured and the reference pre-aligned by it (see the module doc)."""
        return self._linear is not None

    @property
    def delay_ms(self) -> float | None:
        """Estimated delay from our play-time model to the echo in the uplink."""
        return self.delay.delay_ms

    def stats(self) -> EchoStats:
        return EchoStats(self.erle_db, self.delay_ms, self.frames, self._alignment.stamped)
