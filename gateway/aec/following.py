"""How the echo canceller (canceller.py) follows the echo's delay: estimates accepted, the linear
stage built at the delay, rebuilt, moved with it; AEC3's reference moved with it too.

`DelayFollowing` is a part of `EchoCanceller`, as the handling of playback
resumes is (resume.py).

The linear stage (linear.LinearStage: SpeexDSP's filter on the reference
pre-aligned by the measured delay, first run WARM_UP_PASSES times over the last
couple of seconds of uplink, uplink.py) waits for the first estimate. Until it
shows it converged it is rebuilt at new estimates (more audio each time); after
that it follows the delay (`_on_estimate`).

At a resume whose move the shift finder did not measure (resume.py) the stage
is doubted and the delay measured again on what follows the resume alone; a
filter the echo slipped away from shows it (linear.LinearStage.slipped) and is
treated alike. The stage moves with the echo (the room did not change) and must
show again that it cancels (linear.LinearStage.trust), else it is rebuilt on
what followed the resume; AEC3's reference follows the accepted delay so that
its filter fits again.
"""

from __future__ import annotations

import logging

import numpy as np

from gateway.aec.alignment import Aec3Alignment
from gateway.aec.ceiling import EchoCeiling
from gateway.aec.delay import DelayEstimator
from gateway.aec.linear import LEAD_MS, LinearStage
from gateway.aec.reference import EchoReference
from gateway.aec.shift import ShiftFinder
from gateway.aec.uplink import RecentUplink

log = logging.getLogger("gateway.aec.canceller")  # the canceller's one log

MOVE_MS = 2.0  # the echo moved this far since the accepted estimate: the delay moves
SMALL_MOVE_MS = 5.0  # ... a linear stage moved this little is moved as it is (it adapts); further, rebuilt
WARM_UP_PASSES = 3  # a new linear stage runs this many times over the recent uplink (LinearStage.warm_up)
EARLY_REBUILDS = 4  # an unconverged linear stage is rebuilt at each new estimate, this many times
AGREE_MS = 1.0  # otherwise the delay moves only for two estimates of the shift this close


class DelayFollowing:
    reference: EchoReference
    delay: DelayEstimator
    _use_linear: bool
    _alignment: Aec3Alignment
    _ceiling: EchoCeiling
    _linear: LinearStage | None
    _finder: ShiftFinder | None
    _move: tuple[float, float] | None
    _rebuilds: int
    _accepted_ms: float | None
    _anchor: np.ndarray | None
    _last_shift: float | None
    _resumed: bool
    _restarted_ms: float
    _recent: RecentUplink

    def _restart_delay(self, capture_ms: float) -> None:
        self.delay.restart()
        self._resumed = True
        self._restarted_ms = capture_ms

    def _on_estimate(self, estimate: float) -> None:
        """A new delay estimate. Until the linear stage has converged it is rebuilt at each
        estimate (more audio, more passes), at the estimate. After that the delay moves by the
        echo's shift since the accepted estimate (DelayEstimator.shift_since): where two
        estimates agree (one thrown by the user's own speech must not move a working filter),
        and at once after a resume. A stage doubted at a resume is trusted again where the echo
        did not move (linear.LinearStage.trust), and rebuilt on what followed the resume where
        it did. AEC3's reference follows the accepted delay (alignment.py)."""
        self._ceiling.measured_delay(estimate)
        resumed, self._resumed = self._resumed, False
        stage = self._linear
        early = stage is None or (
            not stage.converged and not stage.doubted and self._rebuilds < EARLY_REBUILDS
        )
        if early and stage is not None and self._accepted_ms is not None:
            # a stage still gathering its evidence is rebuilt (more audio, more passes) only where
            # the echo moved or it is failing: a rebuild starts its evidence again
            early = abs(estimate - stage.delay_ms) >= MOVE_MS or stage.failing
        if self._accepted_ms is None or self._anchor is None or (early and self._use_linear):
            self._accept(estimate)
            if self._use_linear:
                self._realign(estimate)
            return
        shift = self.delay.shift_since(self._anchor)
        last, self._last_shift = self._last_shift, shift
        if resumed:
            if shift is not None and abs(shift) < MOVE_MS:
                if stage is not None and stage.doubted:
                    stage.trust(stage.delay_ms)
                return
            self._accept(estimate if shift is None else self._accepted_ms + shift)
            if stage is not None and stage.doubted and shift is not None:
                stage.trust(self._accepted_ms)  # moved with the echo, it must show that it cancels
            elif stage is not None:
                self._rebuild()
            return
        if stage is not None and stage.trust_failed:
            self._rebuild()
            return
        if shift is None or abs(shift) < MOVE_MS or last is None or abs(shift - last) >= AGREE_MS:
            return
        self._accept(self._accepted_ms + shift)
        if stage is None or stage.doubted:
            return
        if abs(self._accepted_ms - stage.delay_ms) <= SMALL_MOVE_MS:
            stage.delay_ms = self._accepted_ms  # a few ms (clock drift): the filter adapts
        else:
            self._realign(self._accepted_ms)

    def _rebuild(self) -> None:
        """A new stage at the accepted delay, warmed up on what followed the last resume."""
        self._rebuilds = 0  # rebuilt at each estimate until it converges, as at the start
        if self._accepted_ms is not None:
            self._realign(self._accepted_ms, since_ms=self._restarted_ms)

    def _accept(self, delay_ms: float) -> None:
        self._accepted_ms = delay_ms
        self._anchor = self.delay.profile
        self._alignment.follow(delay_ms)

    def _realign(self, delay_ms: float, *, since_ms: float | None = None) -> None:
        """A linear stage aligned to `delay_ms`, run over the recent uplink (captured from
        `since_ms` on: after a resume, the echo before it sat elsewhere), takes over."""
        stage = LinearStage.create(delay_ms)
        if stage is None:
            self._use_linear = False
            return
        frames = [
            (pcm, self.reference.read(capture_ms - delay_ms + LEAD_MS, pcm.size))
            for capture_ms, pcm in self._recent
            if since_ms is None or capture_ms >= since_ms
        ]
        stage.warm_up(frames, WARM_UP_PASSES)
        self._linear = stage
        self._finder = None
        self._move = None
        self._rebuilds += 1
        log.debug("echo canceller's linear stage aligned to %.1f ms", delay_ms)
