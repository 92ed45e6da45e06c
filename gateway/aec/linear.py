"""SpeexDSP's linear filter beside AEC3, and the double-talk test on its echo estimate.

`LinearStage` (on by default, config `asr.aec_double_talk`): SpeexDSP's linear
filter on the uplink, beside AEC3, given the reference pre-aligned by the
measured delay (LEAD_MS early: the estimate may lock on a reflection a little
after the direct sound). Its own echo estimate (its input less its output)
tells where the user talks. 2048 taps (128 ms): a room's tail past 64 ms made
the residual of 1024 look like talk at the end of words (bench, reverb: false
barge-ins in 8 of 20 replies); 4096 converged too slowly for the first reply.
The uplink is Opus-coded, and its codec noise is echo that no linear filter
removes: with the echo alone a converged filter leaves ~-15 dB of its echo
estimate (a 10 ms chunk now and then ~-5 dB). A chunk is the user's speech over
the echo when (1) the filter has shown that it converged (half the recent
chunks with echo left under -10 dB, or 2/3 of the loud ones: the quiet ends
of words, where the codec's noise sets what is left, kept a filter at -15..-20
dB on the words unconverged for 2.5 s of the first reply; it stays so down to a
third: the user's first syllables, not yet talk, count against it), (2) it left more than -5 dB
of the estimate (and more than a floor) below BAND_HZ (3 kHz), and (3) Geigel's test passes: the
microphone peaks above what the echo path usually makes of the reference's
recent peak (codec noise passes (2) at times, never (3)). A chunk that left
+5 dB over the estimate is talk where (3) fails by less than half: at a
barge-in's start the two tests often pass in alternate chunks, and the VAD,
given the speech piecemeal, found it up to 470 ms late; a room's tail after a
word also leaves +5 dB, under a far quieter microphone. There the linear
output (speech whole) replaces AEC3's (speech ducked), and a chunk that passed
all three tests and left +5 dB over the estimate holds that for 150 ms: speech
is continuous, the tests are not, and the VAD needs whole syllables.

The residual tests ((2) and +5 dB) weigh the band below BAND_HZ, where the
uplink's Opus coding keeps the waveform (gateway/aec/band.py says why: a
sibilant onset after a short pause, mostly over 4 kHz, passed as talk and held
talk on over the next word's echo, bench stall-room-v2 seed 0, reply 4); the
convergence evidence, the slip test and Geigel's test stay broadband.

The echo moves against the filter where the device's playback moves against
our model (a filter a few ms off leaves the echo whole, and it passes test
(1)): a filter the echo slipped away from adds its prediction to the
microphone instead of taking it off, and `slipped` says so; where playback
resumes after a pause the canceller calls `doubt`. A doubted stage detects no
double talk until it has shown again that it cancels, or the canceller,
having found the echo where it was, calls `trust` and the stage shows that on
VERIFY_CHUNKS; or where the canceller measured the echo's move from the
filter's own echo path (shift.py), `moved` shifts the reference by it, to a
fraction of a sample (reference.EchoReference.read_delayed), and restores the
evidence at once, on probation: for PROBATION_CHUNKS, and until it has shown
again that it cancels, talk needs Geigel's full bound (the moved filter
cancelled onsets after a pause poorly, and the echo left passed the usual
margin: false barge-ins, bench stall models). `echo_like` (no talk, and no louder than Geigel's bound) serves
the canceller's guard. A new stage is first run 3 times over the last couple of
seconds of uplink (`warm_up`). While the reference has been silent for longer
than the filter's span the stage does not run at all.

Tried and dropped: ending the talk hold at a chunk with echo that the filter
takes 10 dB off and that fails Geigel's test (the echo alone). It fixed the
sibilant onset above (stall-room-v2 seed 0, reply 4), but cut the hold in the
user's quiet parts over loud echo: tests/test_aec.py's barge-in was found
640 ms late. And the linear filter in front of AEC3 (a cascade) found every
bench barge-in in time, but in the real-time loopback test
(tests/test_aec_session.py) timing jitter moved the echo against the aligned
reference and AEC3, adapted to the filter's small residual, let echo through:
false barge-ins in 3 of 6 runs.
"""

from __future__ import annotations

import logging
from collections import deque

import numpy as np

from gateway.aec.band import band_power
from gateway.aec.reference import RATE
from gateway.aec.speex import SpeexEchoCanceller, SpeexUnavailable
from gateway.aec.stages import CHUNK

log = logging.getLogger(__name__)

BELOW_WINDOW = 100  # chunks with echo the convergence test looks back over
LOUD_CHUNKS = 30  # ... or, counting only loud ones (EVIDENCE_SHARE), this many with 2/3 left under -10 dB
# (half, as over all chunks, only over BELOW_WINDOW // 2 of them: 16 of 30 was a rebuilt stage's
# evidence from before a barge-in diluted by the user's first syllables, bench stall-room-v2 seed 0)
LOUD_SHARE = 2 / 3

LINEAR_TAPS = 2048  # the linear filter: 128 ms of echo response from the aligned delay on (a room's tail)
NEAR_FLOOR_RMS = 100.0  # double talk needs this much left after the linear filter (-50 dBFS)
ECHO_FLOOR_RMS = 100.0  # chunks with this much predicted echo tell how well the linear stage cancels
CONVERGED_SHARE = 10 ** (-10.0 / 10)  # ... it has converged when half of them left less than -10 dB
CONVERGED_KEEP = 1 / 3  # ... and stays converged down to this share
# loud: an echo estimate within this of the recent loud ones (their 90th percentile). The Opus codec's
# noise follows a 60 ms frame's loud part, and in a quiet chunk (a word's end) it leaves ~-3 dB however
# well the filter fits: bench legacy-v2, a filter at -15..-20 dB on the words looked unconverged for
# 2.5 s of the first reply, and barge-ins then were missed
EVIDENCE_SHARE = 10 ** (-15.0 / 10)
NEAR_TO_ECHO = 0.3  # ... and at least this share of the echo it predicted (-5 dB; echo alone: ~-15, Opus)
GEIGEL_LEARNT = 20  # Geigel's test needs this many echo-alone chunks to know the echo path's gain
SILENT_CHUNKS = 17  # the aligned reference silent this long (> LEAD_MS + the filter's span): nothing to do
SLIP_GAIN = 10 ** (1.0 / 10)  # a chunk the filter's output is this much louder than the microphone ...
SLIP_ECHO = 0.25  # (judged where the microphone holds at least this share of the echo predicted)
SLIP_CHUNKS = 5  # ... this many of the last 2 * SLIP_CHUNKS with echo: the echo slipped away from it
FAILING_CHUNKS = 30  # an unconverged filter that cancels in under a quarter of this many chunks is failing
VERIFY_CHUNKS = 20  # a trusted filter shows this many chunks with echo that it cancels (trust)
HOLD_TO_ECHO = 3.0  # talk that left this share of the echo (+5 dB) ...
HOLD_CHUNKS = 15  # ... holds talk this many chunks on
ALONE_GEIGEL = 0.35  # a +5 dB chunk is talk where Geigel's test fails, but not by more than half
GEIGEL_CHUNKS = 16  # the reference's recent peak: over the filter's span (128 ms + LEAD_MS)
GEIGEL_REF_FLOOR = 1000.0  # ... learnt from chunks whose reference peaked above this (-30 dBFS)
GEIGEL_MARGIN = 0.7  # ... double talk peaks above this times the echo path's usual peak gain
PROBATION_CHUNKS = 250  # a stage moved with the echo (`moved`) takes talk on Geigel's full bound this long
GUARD_GAIN = 1.0  # echo_like before the echo path's peak gain is learnt: 0 dB, more than any path
# the aligned reference runs this far ahead of the echo: the estimate may lock on a reflection a little
# after the direct sound, which the filter must still see coming (it is causal)
LEAD_MS = 30.0


class LinearStage:
    """SpeexDSP's linear filter on a reference aligned to `delay_ms`, and the double-talk test."""

    def __init__(self, delay_ms: float) -> None:
        self.delay_ms = delay_ms
        self.fraction = 0.0  # samples: the reference is read this much later than delay_ms says (moved)
        self._fresh: list[bool] | None = None  # since `moved`: evidence of its own (None: not on probation)
        self._probation = 0  # chunks of probation left
        self._speex = SpeexEchoCanceller(frame=CHUNK, filter_length=LINEAR_TAPS, rate=RATE)
        self._below: deque[bool] = deque(maxlen=BELOW_WINDOW)  # recent chunks with echo: left well under it?
        self._loud_below: deque[bool] = deque(maxlen=BELOW_WINDOW)  # ... of the loud ones (EVIDENCE_SHARE)
        self._echoes: deque[float] = deque(maxlen=BELOW_WINDOW)  # ... their echo estimate's power
        self._gains: deque[float] = deque(maxlen=300)  # mic peak / recent reference peak, echo alone
        self._ref_peaks = np.zeros(GEIGEL_CHUNKS - 1)
        self._silent = SILENT_CHUNKS  # chunks since the aligned reference last had a sample
        self.converged = False
        self._hold = 0
        self._tails = (np.zeros(CHUNK), np.zeros(CHUNK))  # the last chunk's (output, echo estimate)
        self._last_gain = np.zeros(0)  # per chunk of the last `run`: microphone peak / reference's
        self._last_talk = np.zeros(0, bool)
        self._slips: deque[bool] = deque(maxlen=2 * SLIP_CHUNKS)  # recent chunks with echo: added to it?
        self.slipped = False  # the echo moved away from the filter (canceller: doubt, measure again)
        self._doubted: tuple[list[bool], bool] | None = None  # the evidence before a doubt
        self._restore_in = 0  # chunks until the filter has forgotten the old alignment (trust)
        self._verifying = False
        self.trust_failed = False  # it did not show that it cancels where it was trusted

    @staticmethod
    def create(delay_ms: float) -> LinearStage | None:
        """None without libspeexdsp (logged)."""
        try:
            return LinearStage(delay_ms)
        except SpeexUnavailable as exc:
            log.warning("server AEC without its linear stage (weaker at double talk): %s", exc)
            return None

    def warm_up(self, frames: list[tuple[np.ndarray, np.ndarray]], passes: int) -> None:
        """Adapts over past (uplink, aligned reference) frames `passes` times over.

        An MDF filter given the same echo again keeps adapting: 3 passes over 1.5 s of reply
        leave ~-22 dB where one pass leaves ~-15 (the bench's slowest path). None of it counts
        towards convergence: on audio it was trained on the filter looks better than it is
        (taken as converged that early, it let echo through as double talk in the bench).
        """
        for _ in range(passes):
            for mic, ref in frames:
                self.run(mic, ref)
        self._below.clear()
        self._loud_below.clear()
        self.converged = False

    def doubt(self) -> None:
        """The echo may have moved against the filter (playback resumed after a pause): no double
        talk until the filter has shown again that it cancels, or `trust` says where it went."""
        if self._doubted is None:
            self._doubted = (list(self._below), self.converged)
        self._below.clear()
        self._loud_below.clear()
        self.converged = False
        self._hold = 0
        self._restore_in = 0
        self._verifying = False
        self.trust_failed = False
        self._slips.clear()
        self.slipped = False

    @property
    def doubted(self) -> bool:
        return self._doubted is not None

    def trust(self, delay_ms: float) -> None:
        """The echo was measured again at `delay_ms` after a doubt: the filter (the room did not
        change, only the delay) should hold at that alignment. Once the reference it remembers
        (its span) has all been read at the new alignment, it has VERIFY_CHUNKS of echo to show
        that it cancels there; then its evidence from before the doubt is restored (else it
        stays doubted until it converges again)."""
        self.delay_ms = delay_ms
        if self._doubted is not None:
            self._restore_in = SILENT_CHUNKS
            self._verifying = False

    @property
    def proven(self) -> bool:
        """Converged, or was so where it was doubted (its echo path is known)."""
        return self.converged or (self._doubted is not None and self._doubted[1])

    def impulse_response(self) -> np.ndarray:
        """The filter's echo path (SpeexDSP's units), from `delay_ms - LEAD_MS` on."""
        return self._speex.impulse_response()

    def moved(self, shift_ms: float) -> None:
        """The echo moved by `shift_ms` (later positive) and the filter, moved with it, was shown
        to predict it there (shift.ShiftFinder): its evidence from before the doubt holds, on
        probation (Geigel's full bound for talk, see the module doc)."""
        moved = self.fraction + shift_ms * RATE / 1000  # in samples
        whole = round(moved)
        self.delay_ms += whole * 1000 / RATE
        self.fraction = moved - whole
        if self._doubted is not None:
            below, converged = self._doubted
            self._below.clear()
            self._below.extend(below)
            self.converged = converged
            self._doubted = None
        self._restore_in = 0
        self._verifying = False
        self.trust_failed = False
        self._fresh = []  # on probation until it has shown again that it cancels ...
        self._probation = PROBATION_CHUNKS  # ... and for this long

    def _restore(self, chunks: int) -> None:
        if self._doubted is None:
            return
        if self._restore_in:
            self._restore_in = max(self._restore_in - chunks, 0)
            if not self._restore_in:
                self._below.clear()
                self._verifying = True
        elif self._verifying and len(self._below) >= VERIFY_CHUNKS:
            self._verifying = False
            self.trust_failed = sum(self._below) < 0.5 * len(self._below)
            if not self.trust_failed:
                below, converged = self._doubted
                self._below.clear()
                self._below.extend(below)
                self.converged = converged
                self._doubted = None

    def run(self, mic: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The linear filter's output for the whole 10 ms chunks of `mic`, and which are double talk.

        None while the aligned reference has been silent for longer than the filter's span:
        there is no echo to cancel, nothing for the filter to learn, and AEC3's output is
        the one to use (this keeps the stage's cost to the times we play).
        """
        whole = mic.size - mic.size % CHUNK
        if not whole:
            return None
        heard = np.abs(ref[:whole].reshape(-1, CHUNK)).max(axis=1) > 0
        if self._silent >= SILENT_CHUNKS and not heard.any():
            return None
        last = np.flatnonzero(heard)
        self._silent = whole // CHUNK - 1 - int(last[-1]) if last.size else self._silent + whole // CHUNK
        linear = self._speex.cancel(mic[:whole], ref[:whole])
        talk = self._double_talk(mic[:whole], ref[:whole], linear)
        self._restore(whole // CHUNK)
        return linear, talk

    def _double_talk(self, mic: np.ndarray, ref: np.ndarray, linear: np.ndarray) -> np.ndarray:
        """Per 10 ms chunk: the user talks over the echo (both tests below pass, or the first
        one by far: what the filter left is +5 dB over its echo estimate).

        1. What the linear filter left is loud against the echo it predicted; only once the
           filter has shown it cancels (half the recent chunks with echo left well under it):
           an unconverged filter leaves echo, not speech.
        2. Geigel's test: the microphone peaks above anything the echo path has made of the
           reference's loudest recent sample. The uplink is Opus-coded: its codec noise
           (~-15 dB of the echo, often -5 dB in a 10 ms chunk) is echo no linear filter can
           remove, and passes the first test alone (false barge-ins in the real-time test).
        """
        left = np.mean(linear.astype(np.float64).reshape(-1, CHUNK) ** 2, axis=1)
        estimate = mic.astype(np.float64) - linear
        echo = np.mean(estimate.reshape(-1, CHUNK) ** 2, axis=1)
        # the residual tests weigh the band the uplink's codec keeps the waveform in (BAND_HZ)
        left_band = band_power(linear, self._tails[0])
        echo_band = band_power(estimate, self._tails[1])
        self._tails = (linear[-CHUNK:].astype(np.float64), estimate[-CHUNK:])
        mic_peak = np.abs(mic.reshape(-1, CHUNK)).max(axis=1).astype(np.float64)
        peaks = np.concatenate([self._ref_peaks, np.abs(ref.reshape(-1, CHUNK)).max(axis=1)])
        n = peaks.size - GEIGEL_CHUNKS + 1
        window = peaks[:n].copy()
        for k in range(1, GEIGEL_CHUNKS):  # the running max over GEIGEL_CHUNKS chunks
            np.maximum(window, peaks[k : k + n], out=window)
        window += 1.0
        self._ref_peaks = peaks[-(GEIGEL_CHUNKS - 1) :]
        gain = mic_peak / window
        learnt = len(self._gains) >= GEIGEL_LEARNT
        # moved, its evidence restored but not yet its own again (`moved`): Geigel's test in full
        # (the echo path's usual peak gain, not less): where SpeexDSP, moved, cancels an onset
        # after a pause poorly, the echo left passed GEIGEL_MARGIN (bench, stall models)
        margin = 1.0 if self._fresh is not None else GEIGEL_MARGIN
        louder = gain > margin * float(np.percentile(self._gains, 95)) if learnt else np.ones(gain.size, bool)
        mic_power = np.mean(mic.astype(np.float64).reshape(-1, CHUNK) ** 2, axis=1)
        # a filter the echo has slipped away from (the device's playback moved) adds its prediction
        # to the microphone instead of taking it off, where the microphone holds about as much
        # echo as it predicts and no more than the echo path makes (no one talking)
        adds = (left > mic_power * SLIP_GAIN) & (echo > ECHO_FLOOR_RMS**2)
        judged = (echo > ECHO_FLOOR_RMS**2) & ~louder & (mic_power > echo * SLIP_ECHO)
        self._slips.extend(adds[judged].tolist())
        self.slipped = self.converged and sum(self._slips) >= SLIP_CHUNKS
        talk = (left_band > NEAR_FLOOR_RMS**2) & (left_band > echo_band * NEAR_TO_ECHO) & ~adds
        strong = left_band > echo_band * HOLD_TO_ECHO
        alone = np.zeros_like(talk)  # well above the echo: talk even where Geigel's test fails ...
        if not self.converged or not learnt:
            talk[:] = False
        elif talk.any():
            # the room's tail after a word, which no linear filter of ours takes off, also leaves
            # +5 dB, but under a microphone far quieter than the echo path's usual peak
            alone = talk & strong & (gain > ALONE_GEIGEL * float(np.percentile(self._gains, 95)))
            if self._fresh is not None:
                alone[:] = False
            talk &= louder
        talk = self._hold_on(talk, strong) | alone  # ... but only talk that passed it holds talk on
        self._last_gain, self._last_talk = gain, talk
        with_echo = (echo > ECHO_FLOOR_RMS**2) & ~talk  # the user's speech says nothing of the filter
        evidence = with_echo.copy()
        if learnt:  # nor what peaks above all the echo path usually makes: the user's first syllables
            evidence &= gain <= float(np.percentile(self._gains, 95))
        below_now = (left[evidence] < echo[evidence] * CONVERGED_SHARE).tolist()
        self._below.extend(below_now)
        self._echoes.extend(echo[with_echo].tolist())
        if self._echoes:
            loud = evidence & (echo >= EVIDENCE_SHARE * float(np.percentile(self._echoes, 90)))
            self._loud_below.extend((left[loud] < echo[loud] * CONVERGED_SHARE).tolist())
        if self._fresh is not None:
            self._fresh.extend(below_now)
            self._probation -= left.size
            if (
                self._probation <= 0
                and len(self._fresh) >= BELOW_WINDOW // 2
                and sum(self._fresh) >= 0.5 * len(self._fresh)
            ):
                self._fresh = None
        self._gains.extend(gain[with_echo & (window > GEIGEL_REF_FLOOR)].tolist())
        below = self._below
        # converged once half the chunks with echo left under -10 dB; it stays so down to a third
        # (the user's first syllables over the echo, not yet talk, count as chunks it did not cancel)
        # (or of the loud ones alone: EVIDENCE_SHARE)
        share = CONVERGED_KEEP if self.converged else 0.5
        self.converged = self._shown(below, share, BELOW_WINDOW // 2) or self._shown(
            self._loud_below, share, BELOW_WINDOW // 2, LOUD_CHUNKS
        )
        if self.converged:  # shown again: no evidence to restore
            self._doubted = None
            self._restore_in = 0
            self._verifying = False
        return talk

    def _shown(self, below: deque[bool], share: float, chunks: int, fewer: int | None = None) -> bool:
        """`below` shows the filter converged: `share` of at least `chunks` left under -10 dB, or of
        at least `fewer` (LOUD_SHARE where it is not converged yet)."""
        n, hits = len(below), sum(below)
        if n >= chunks and hits >= share * n:
            return True
        if fewer is None or n < fewer:
            return False
        return hits >= (share if self.converged else LOUD_SHARE) * n

    @property
    def failing(self) -> bool:
        """Shown, over enough chunks with echo, that it does not cancel (aligned wrong?)."""
        return len(self._below) >= FAILING_CHUNKS and sum(self._below) < 0.25 * len(self._below)

    @property
    def learnt(self) -> bool:
        """Geigel's test knows the echo path's usual peak gain."""
        return len(self._gains) >= GEIGEL_LEARNT

    def echo_like(self) -> np.ndarray:
        """Per chunk of the last `run`: no talk, and the microphone no louder than the echo path
        usually makes of the reference's recent peak (Geigel; its 95th percentile), for the
        canceller's early guard."""
        return ~self._last_talk & (self._last_gain <= self.peak_gain())

    def peak_gain(self) -> float:
        """Geigel's bound: the echo path's usual peak gain (its 95th percentile; GUARD_GAIN before
        it is learnt)."""
        return float(np.percentile(self._gains, 95)) if len(self._gains) >= GEIGEL_LEARNT else GUARD_GAIN

    def release_hold(self) -> None:
        """Talk found so far holds no more chunks on (`_hold_on`)."""
        self._hold = 0

    def _hold_on(self, talk: np.ndarray, strong: np.ndarray) -> np.ndarray:
        """A talk chunk that left well above the echo holds talk for HOLD_CHUNKS: speech is
        continuous, the tests are not (a syllable's quiet parts, the echo's loud ones), and the
        VAD needs whole syllables. Weak ones do not: a filter the echo has slipped away from a
        little (timing jitter) leaves about as much as the echo, at times taken for talk."""
        held = talk.copy()
        for k in range(talk.size):
            if talk[k] and strong[k]:
                self._hold = HOLD_CHUNKS
            elif self._hold:
                self._hold -= 1
                held[k] = True
        return held
