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
replaces AEC3's for that 10 ms. Until it shows it converged it is rebuilt at
new estimates (more audio each time); after that it follows the delay
(`_on_estimate`).

The echo moves: where playback resumes after running dry, the device's pause
may have been longer or shorter than ours (0.1-0.2 s with a jitter buffer that
waits for a few frames before it starts again), and a device can run dry on
its own (bursty network). At a resume the stage is doubted and the delay
measured again on what follows it alone; a filter the echo slipped away from
shows it (linear.LinearStage.slipped) and is treated alike. The stage moves
with the echo (the room did not change) and must show again that it cancels
(linear.LinearStage.trust), else it is rebuilt on what followed the resume;
AEC3's reference follows the accepted delay so that its filter fits again.
That took 1-1.5 s (stall models: barge-ins found late, false ones from AEC3
re-aligned). A proven stage now waits at the resume instead while
shift.ShiftFinder measures the echo's move from the stage's own echo path
(~100-250 ms of echo after it, with the user talking or not); the stage then
moves by it (to a sixteenth of a sample), keeps its evidence, and runs once
over the frames it waited on. Where the finder finds nothing (a filter that
does not predict the echo, no clear peak) the slow path above remains. The
echo may come back up to 250 ms sooner than the stage expects it, which to
the stage is talk: before the resume, new talk that the echo path could make
of what plays after it (Geigel's bound) is muted (`_before_resume`).

Echo ceiling (ceiling.py): how loud the echo can be in each chunk, learnt
without its delay. Far above it a chunk is the user's, whatever AEC3 makes of
it: with little or no echo (a clean uplink) AEC3, whose filter has nothing to
converge on, ducked speech wherever we played (the user found 0.6-2 s late).

Guard: while AEC3 may leak echo, a chunk that may only be echo and that the
stage does not take for talk is muted: for the first GUARD_S of reply played
(AEC3 can leak ~1 s into the first reply), for RESUME_GUARD_S after a resume or
a slip, and while AEC3 shows that it leaks (over the last loud chunks that may
only be echo it took off under 20 dB; converged it takes off 30-45). "May only
be echo": the stage's Geigel test where it has learnt the echo path
(linear.LinearStage.echo_like), else at or under the ceiling.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

import numpy as np

from gateway.aec.alignment import Aec3Alignment, CaptureClock
from gateway.aec.ceiling import ECHO_DB, TALK_DB, EchoCeiling
from gateway.aec.delay import DelayEstimator, moved_profile
from gateway.aec.linear import HOLD_CHUNKS, LEAD_MS, LinearStage
from gateway.aec.reference import RATE, SAMPLES_PER_MS, EchoReference
from gateway.aec.shift import MAX_SHIFT_MS, MIN_SHIFT_MS, ShiftFinder
from gateway.aec.stages import CHUNK, Aec3

log = logging.getLogger(__name__)

GUARD_S = 2.0  # AEC3 may leak echo this early in a session (s of reply played): the early guard
RESUME_GUARD_S = 1.5  # ... and this long after playback resumes (the echo may have moved)
ACTIVE_RMS = 50.0  # a reference frame this loud counts towards ERLE
CONVERGE_S = 1.0  # reference playing this long before ERLE counts
MOVE_MS = 2.0  # the echo moved this far since the accepted estimate: the delay moves
SMALL_MOVE_MS = 5.0  # ... a linear stage moved this little is moved as it is (it adapts); further, rebuilt
WARM_UP_S = 2.0  # uplink kept to run a new linear stage over before it takes over
WARM_UP_PASSES = 3  # ... this many times over (linear.LinearStage.warm_up)
EARLY_REBUILDS = 4  # an unconverged linear stage is rebuilt at each new estimate, this many times
AGREE_MS = 1.0  # otherwise the delay moves only for two estimates of the shift this close
RESUME_FIRST_S = 0.5  # after a resume, a new estimate from this much uplink after it
LEAK_CHUNKS = 20  # AEC3's recent cancelling, over this many loud chunks that may only be echo ...
LEAK = 10 ** (20.0 / 10)  # ... leaks below this (median)
LOUD_RMS = 100.0  # ... chunks this loud (-50 dBFS)
CALIBRATE_S = 1.0  # a shift search scales the stage's echo path on this much uplink before the resume
SHIFT_GIVE_UP_S = 1.0  # ... and gives up this long after the latest move it looks for
TALK = 10 ** (TALK_DB / 10)
ECHO = 10 ** (ECHO_DB / 10)


@dataclass
class EchoStats:
    erle_db: float | None
    delay_ms: float | None
    frames: int
    aligned_by_timestamps: bool


class EchoCanceller:
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
        self._talk_hold = 0
        self.guarding = False  # the last frame muted what may only be echo (AEC3 may leak)
        self._leaks: deque[float] = deque(maxlen=LEAK_CHUNKS)  # mic / AEC3 output powers, echo alone
        self._guard_until_ms = 0.0  # capture time: muting what may be echo (AEC3 may leak) until then
        self._linear: LinearStage | None = None  # once the delay is measured
        self._finder: ShiftFinder | None = None  # measuring the echo's move at a resume (the stage waits)
        self._waiting_from_ms = 0.0  # capture time of the first frame the stage waits on
        self._shifted: deque[float] = deque(maxlen=8)  # resumes whose move the finder measured
        self._doubted_at: deque[float] = deque(maxlen=8)  # resumes at which the stage was doubted
        self._talking = False  # the stage's last chunk was talk
        self._offset_at_resume = 0.0  # AEC3's reference offset where its reference resumed
        self._held_back = np.zeros(0, bool)  # this frame's chunks of talk just before a resume: muted
        self._move: tuple[float, float] | None = None  # the last: (resume, the stage's delay before it)
        self._rebuilds = 0
        self._accepted_ms: float | None = None  # the delay the stage and AEC3's reference follow
        self._anchor: np.ndarray | None = None  # the estimator's profile where it was accepted
        self._last_shift: float | None = None
        self._resumed = False  # playback resumed since the last estimate
        self._restarted_ms = 0.0  # capture time from which the delay is measured again
        self._recent: deque[tuple[float, np.ndarray]] = deque()  # (capture ms, uplink pcm) to warm up on
        self._recent_samples = 0
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
            self._guard_until_ms = capture_ms + RESUME_GUARD_S * 1000
            self._leaks.clear()  # how AEC3 cancelled before says nothing of how it does now
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
                self._guard_until_ms = capture_ms + RESUME_GUARD_S * 1000
                self._leaks.clear()
                self._restart_delay(capture_ms)
        self._talking = ran is not None and bool(ran[1][-1:].any())
        out = self._choose(pcm, capture_ms, out, ran)
        self.frames += 1
        self._account(pcm, ref, out)
        if self._use_linear:
            self._keep(capture_ms, pcm)
        estimate = self.delay.push(pcm, capture_ms)  # absolute: from our play-time model to the uplink
        if estimate is not None:
            self._on_estimate(estimate)
        return out

    def _choose(
        self, pcm: np.ndarray, capture_ms: float, out: np.ndarray, ran: tuple[np.ndarray, np.ndarray] | None
    ) -> np.ndarray:
        """Per 10 ms chunk: AEC3's output; where the user talks, their words whole (the linear
        stage's double talk, or far above what the echo can be: the ceiling); while AEC3 may leak
        (the guards), nothing where it may be echo."""
        chunks = pcm.size // CHUNK
        if not chunks:
            return out
        power = np.mean(pcm[: chunks * CHUNK].astype(np.float64).reshape(chunks, CHUNK) ** 2, axis=1)
        bound = self._ceiling.push(power, capture_ms)
        learnt = self._ceiling.gain2 is not None
        talk = np.zeros(chunks, bool) if ran is None else ran[1]
        whole = pcm if ran is None else ran[0]  # the linear stage's output: less the echo it predicts
        stage = self._linear
        if ran is not None and stage is not None and stage.learnt and not stage.doubted:
            may_be_echo = stage.echo_like()  # aligned: what the echo path makes of the reference just played
        else:
            may_be_echo = power <= bound * ECHO  # wherever the echo is: the ceiling
        held_back = self._held_back if self._held_back.size == chunks else np.zeros(chunks, bool)
        self._held_back = np.zeros(0, bool)
        leaking = self._aec3_leaking(power, out, may_be_echo & ~talk)
        guard = self._active_s < GUARD_S or capture_ms < self._guard_until_ms or leaking
        self.guarding = guard
        for k in range(chunks):
            part = slice(k * CHUNK, (k + 1) * CHUNK)
            if learnt and power[k] > bound[k] * TALK:
                self._talk_hold = HOLD_CHUNKS
            elif self._talk_hold:
                self._talk_hold -= 1
            elif not talk[k]:
                if (guard and may_be_echo[k]) or held_back[k]:
                    out[part] = 0
                continue
            out[part] = whole[part]
        return out

    def _restart_delay(self, capture_ms: float) -> None:
        self.delay.restart()
        self._resumed = True
        self._restarted_ms = capture_ms

    def _aec3_leaking(self, power: np.ndarray, out: np.ndarray, echo: np.ndarray) -> bool:
        """Whether AEC3 lets echo through: over the last LEAK_CHUNKS loud chunks that may only be
        echo, it took off less than LEAK_DB (median). Converged it takes off 30-45 dB; it leaks
        for seconds where the echo moved (the device resumed later or sooner than we did, or ran
        dry) or early on, at times only 5 dB. The user's words under the echo's level count too;
        the guard then mutes them, as AEC3 would duck most of them."""
        chunks = power.size
        kept = out[: chunks * CHUNK].astype(np.float64).reshape(chunks, CHUNK)
        left = np.mean(kept**2, axis=1)
        for k in np.flatnonzero(echo & (power > LOUD_RMS**2)):
            self._leaks.append(float(power[k] / max(left[k], 1.0)))
        return len(self._leaks) >= LEAK_CHUNKS // 4 and float(np.median(self._leaks)) < LEAK

    def _resumed_in(self, start_ms: float, end_ms: float) -> bool:
        return any(start_ms <= t < end_ms for t in self.reference.resumes)

    def _resume_in(self, start_ms: float, end_ms: float) -> float | None:
        """Where playback resumed between the two play times, unless the echo's move there is
        known (shift.ShiftFinder)."""
        return next(
            (t for t in self.reference.resumes if start_ms <= t < end_ms and t not in self._shifted), None
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
        self._held_back = held_back
        return whole, talk & ~held_back

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
        mic = self._uplink(start_ms, min(finder.echo_ms, capture_ms))
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
        mic = self._uplink(finder.start_ms, end_ms, (capture_ms, pcm))
        shift = None if mic is None else finder.find(mic)
        if shift is None and end_ms < finder.echo_ms + MAX_SHIFT_MS + SHIFT_GIVE_UP_S * 1000:
            return None
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
        for frame_ms, frame in frames:
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

    def _uplink(
        self, start_ms: float, end_ms: float, current: tuple[float, np.ndarray] | None = None
    ) -> np.ndarray | None:
        """The uplink captured from `start_ms` to `end_ms` (kept frames, and `current`); None where
        it does not reach back that far."""
        frames = list(self._recent) + ([current] if current is not None else [])
        if not frames or frames[0][0] > start_ms + 1.0 or end_ms <= start_ms:
            return None
        out = np.zeros(int(round((end_ms - start_ms) * SAMPLES_PER_MS)), np.int16)
        for frame_ms, frame in frames:
            at = int(round((frame_ms - start_ms) * SAMPLES_PER_MS))
            lo, hi = max(at, 0), min(at + frame.size, out.size)
            if hi > lo:
                out[lo:hi] = frame[lo - at : hi - at]
        return out

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

    def _keep(self, capture_ms: float, pcm: np.ndarray) -> None:
        self._recent.append((capture_ms, pcm))
        self._recent_samples += pcm.size
        while self._recent_samples - self._recent[0][1].size >= WARM_UP_S * RATE:
            self._recent_samples -= self._recent.popleft()[1].size

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
        return self.delay.delay_ms

    def stats(self) -> EchoStats:
        return EchoStats(self.erle_db, self.delay_ms, self.frames, self._alignment.stamped)
