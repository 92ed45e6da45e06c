"""The echo canceller (canceller.py) where playback resumes: the echo's move measured from the linear
stage's echo path while the stage waits, the stage's reference across that move, and talk just before a
resume that the resumed echo may be.

`ResumeHandling` is a part of `EchoCanceller`, as `DelayFollowing` is (following.py).

The echo moves: where playback resumes after running dry, the device's pause
may have been longer or shorter than ours (0.1-0.2 s with a jitter buffer that
waits for a few frames before it starts again), and a device can run dry on
its own (bursty network). Measuring the delay again on what follows the resume
alone (following.py) took 1-1.5 s (stall models: barge-ins found late, false
ones from AEC3 re-aligned). A proven stage now waits at the resume instead
while shift.ShiftFinder measures the echo's move from the stage's own echo path
(~100-250 ms of echo after it, with the user talking or not); the stage then
moves by it (to a sixteenth of a sample), keeps its evidence, and runs once
over the frames it waited on (talk it finds in their first chunks, where
SpeexDSP's reference history is still the old alignment's, holds on over no
later frame). Where the finder finds nothing (a filter that does not predict
the echo, no clear peak) the slow path remains. While the stage waits, the
resume guard mutes what may be echo; what no move of the echo explains
(ShiftFinder.unexplained: the user who talks while the device is still silent
after the stall, or over the echo before its move is clear) passes whole. The echo may
come back up to 250 ms sooner than the stage expects it, which to the stage is
talk: before the resume, new talk that the echo path could make of what plays
after it (Geigel's bound) is muted (`_before_resume`).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from gateway.aec.alignment import Aec3Alignment
from gateway.aec.delay import moved_profile
from gateway.aec.guard import EchoGuard
from gateway.aec.linear import LEAD_MS, LinearStage
from gateway.aec.reference import SAMPLES_PER_MS, EchoReference
from gateway.aec.shift import MAX_SHIFT_MS, MIN_SHIFT_MS, ShiftFinder
from gateway.aec.stages import CHUNK
from gateway.aec.uplink import RecentUplink

log = logging.getLogger("gateway.aec.canceller")  # the canceller's one log

CALIBRATE_S = 1.0  # a shift search scales the stage's echo path on this much uplink before the resume
SHIFT_GIVE_UP_S = 1.0  # ... and gives up this long after the latest move it looks for


class ResumeHandling:
    reference: EchoReference
    _alignment: Aec3Alignment
    _guard: EchoGuard
    _linear: LinearStage | None
    _finder: ShiftFinder | None  # measuring the echo's move at a resume (the stage waits)
    _waiting_from_ms: float  # capture time of the first frame the stage waits on
    _shifted: deque[float]  # resumes whose move the finder measured
    _doubted_at: deque[float]  # resumes at which the stage was doubted
    _talking: bool  # the stage's last chunk was talk
    _offset_at_resume: float  # AEC3's reference offset where its reference resumed
    _move: tuple[float, float] | None  # the last: (resume, the stage's delay before it)
    _accepted_ms: float | None
    _anchor: np.ndarray | None
    _resumed: bool
    _recent: RecentUplink

    if TYPE_CHECKING:  # following.py's, used here

        def _accept(self, delay_ms: float) -> None: ...

    def _resumed_in(self, start_ms: float, end_ms: float) -> bool:
        return any(start_ms <= t < end_ms for t in self.reference.resumes)

    def _resume_in(self, start_ms: float, end_ms: float) -> float | None:
        """Where playback resumed between the two play times, unless the echo's move there is
        known (shift.ShiftFinder)."""
        return next(
            (t for t in self.reference.resumes if start_ms <= t < end_ms and t not in self._shifted), None
        )

    def _stage_resume_in(self, start_ms: float, end_ms: float) -> float | None:
        """`_resume_in` for the linear stage: each resume once."""
        return next(
            (
                t
                for t in self.reference.resumes
                if start_ms <= t < end_ms and t not in self._shifted and t not in self._doubted_at
            ),
            None,
        )

    def _before_resume(
        self, ran: tuple[np.ndarray, np.ndarray], pcm: np.ndarray, resumed_ms: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The stage's output just before a resume whose echo may come back early: its new talk
        (from the first chunk without it on) may be that echo, which the stage does not expect
        yet. Where the microphone peaks no higher than the echo path (Geigel's bound) makes of
        what plays in the first -MIN_SHIFT_MS after the resume, it is muted."""
        stage = self._linear
        assert stage is not None
        whole, talk = ran
        ongoing = np.logical_and.accumulate(talk) if self._talking else np.zeros_like(talk)
        chunks = talk.size
        peaks = np.max(np.abs(pcm[: chunks * CHUNK].astype(np.float64).reshape(chunks, CHUNK)), axis=1)
        resumed = self.reference.read(resumed_ms, int(-MIN_SHIFT_MS * SAMPLES_PER_MS) + CHUNK)
        bound = stage.peak_gain() * float(np.max(np.abs(resumed.astype(np.float64))))
        held_back = talk & ~ongoing & (peaks <= bound)
        self._guard.hold_back(held_back)
        return whole, talk & ~held_back

    # ---- the echo's move at a resume ------------------------------------------------

    def _search_shift(self, resumed_ms: float, capture_ms: float) -> None:
        """A proven stage stops where playback resumed (what it would learn there may be the
        echo moved against it) until a ShiftFinder has measured the echo's move from its echo path."""
        stage = self._linear
        if stage is None or not stage.proven:
            return
        finder = ShiftFinder(
            self.reference.read,
            stage.impulse_response(),
            delay_ms=stage.delay_ms,
            lead_ms=LEAD_MS,
            resumed_ms=resumed_ms,
        )
        start_ms = min(finder.echo_ms, capture_ms) - CALIBRATE_S * 1000
        mic = self._recent.between(start_ms, min(finder.echo_ms, capture_ms))
        if mic is None or not finder.calibrate(mic, start_ms):
            log.debug("echo canceller: no shift search at a resume (the filter does not predict the echo)")
            return
        self._finder = finder
        self._waiting_from_ms = capture_ms

    def _find_shift(self, pcm: np.ndarray, capture_ms: float) -> tuple[np.ndarray, np.ndarray] | None:
        """The finder's verdict with this frame; once it has one, the stage moves by it and runs
        over the frames it waited on (the last one's output is this frame's)."""
        finder, stage = self._finder, self._linear
        assert finder is not None and stage is not None
        end_ms = capture_ms + pcm.size / SAMPLES_PER_MS
        mic = self._recent.between(finder.start_ms, end_ms, (capture_ms, pcm))
        shift = None if mic is None else finder.find(mic)
        if shift is None and end_ms < finder.echo_ms + MAX_SHIFT_MS + SHIFT_GIVE_UP_S * 1000:
            # the stage waits; what no move of the echo explains is the user's, whole (else the resume
            # guard mutes it until the move is measured)
            talk = np.zeros(0, bool) if mic is None else finder.unexplained(mic, pcm.size // CHUNK)
            return (pcm.copy(), talk) if talk.any() else None
        self._finder = None
        if shift is not None:
            self._move = (finder.resumed_ms, stage.delay_ms)
            stage.moved(shift)
            self._shifted.append(finder.resumed_ms)
            self._resumed = False  # the move after the resume is measured
            if self._accepted_ms is not None:
                self._alignment.moved(self._accepted_ms, self._offset_at_resume)
                self._accept(self._accepted_ms + shift)
            if self._anchor is not None:
                self._anchor = moved_profile(self._anchor, shift)
            log.debug("echo canceller: the echo moved %.1f ms where playback resumed", shift)
        # else: not found; the stage, doubted, goes on as it was (the delay is measured again)
        ran = None
        frames = [(c, p) for c, p in self._recent if c >= self._waiting_from_ms] + [(capture_ms, pcm)]
        # once: run again over the same frames, SpeexDSP's filter (its reference history broken
        # between passes) took talk for echo after the move (bench: stall-plain-v1 seed 2)
        for k, (frame_ms, frame) in enumerate(frames):
            if k == len(frames) - 1 and not self._talking:
                # the frames it waited on are sent already; talk it found there (its first chunks
                # after the move, SpeexDSP's reference history still the old alignment's) must not
                # hold on over this frame's echo (bench stall-plain-v1 seed 0 barge-in 8: the echo
                # passed, 10 dB off, for 120 ms after the move and the VAD took it for speech)
                stage.release_hold()
            ran = stage.run(frame, self._stage_reference(frame_ms, frame.size))
        return ran

    def _stage_reference(self, capture_ms: float, size: int) -> np.ndarray:
        """The linear stage's reference for uplink captured from `capture_ms` on: read at its
        alignment, but where the echo moved at a resume, what played before it where its echo was
        (else the stage learns the echo of that where the uplink is silent, and unlearns the path)."""
        stage = self._linear
        assert stage is not None
        aligned_ms = capture_ms - stage.delay_ms + LEAD_MS
        ref = self.reference.read_delayed(aligned_ms, size, stage.fraction)
        if self._move is None:
            return ref
        resumed_ms, old_delay_ms = self._move
        old_ms = capture_ms - old_delay_ms + LEAD_MS
        if old_ms >= resumed_ms and aligned_ms >= resumed_ms:
            return ref
        new_from = min(max(int(round((resumed_ms - aligned_ms) * SAMPLES_PER_MS)), 0), size)
        old_to = min(max(int(round((resumed_ms - old_ms) * SAMPLES_PER_MS)), 0), size)
        out = np.zeros(size, np.int32)
        out[new_from:] = ref[new_from:]
        out[:old_to] += self.reference.read(old_ms, old_to)
        return np.clip(out, -32768, 32767).astype(np.int16)
