"""How far the echo moved where playback resumed, from the linear stage's echo path.

Where playback resumes after running dry, the device's pause may have been
longer or shorter than ours: with a jitter buffer that waits for a few frames
before it plays again, the echo after the resume sits up to ~0.2 s later or
earlier against our play-time model (scripts/aec_devices.py, stall models),
while the room, and so the linear stage's echo path, did not change. The
stage's filter only needs moving. Measuring that move with the delay estimator
(GCC-PHAT over 0.5 s of uplink, then a check that the moved filter cancels)
took 1-1.5 s, and the user who talked in that time was muted by the resume
guard or found late.

`ShiftFinder` takes the converged filter's impulse response (SpeexDSP gives
it: speex.SpeexEchoCanceller.impulse_response) at the resume and predicts the
echo of what was played after it; each new uplink frame it correlates the
uplink since then with that prediction over the possible moves (MIN_SHIFT_MS
to MAX_SHIFT_MS, every sample: a filter moved a sample off leaves the top of
the speech band whole). The prediction holds the room's response and the echo
path's gain, so the answer checks itself: at the move found, the prediction
scaled by ~1 (GAIN_RANGE: the path's gain did not change) must explain a good
share of the uplink (MIN_MATCH; the user's speech over it does not correlate),
the whitened correlation's peak must stand out (MIN_CONFIDENCE) and no other
move may come close (RUNNER_UP). ~100-250 ms of echo after the resume are
enough, with the user talking over it.

Until then the stage waits and the resume guard mutes what may be echo; a
user who talked right after the resume, the device still silent, was muted
until the move was measured (found up to 0.84 s late). `unexplained` says
which chunks no move of the echo explains: the prediction (of what played from
BEFORE_MS before the resume on: where the device ran dry before we expected,
the end of what played before the resume moves too) at every move from
MIN_SHIFT_MS on, scaled within GAIN_RANGE, leaves more than half of a 30 ms
window of uplink. The echo at its move leaves ~-15 dB; speech over silence or
over the echo leaves most of itself. Those chunks pass whole.

Hand-written on numpy's FFT: neither library measures a move of its own
filter (AEC3 re-searches its delay over seconds, SpeexDSP has no delay search).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

RATE = 16000
SAMPLES_PER_MS = RATE // 1000
MIN_SHIFT_MS = -250.0  # the echo after a resume this much earlier ...
MAX_SHIFT_MS = 250.0  # ... to this much later than before it (device models: -180..+170 ms)
MIN_ECHO_MS = 100.0  # the prediction must cover this much uplink after the move
ECHO_FLOOR_RMS = 30.0  # ... at this level (-60 dBFS) on average
MIN_MATCH = 0.4  # correlation coefficient of the uplink and the moved, scaled prediction
GAIN_RANGE = (0.5, 2.0)  # the moved prediction's least-squares gain against the uplink
MIN_CONFIDENCE = 10.0  # whitened correlation: peak over its spread
RUNNER_UP = 0.6  # ... and no peak further than RUNNER_UP_MS away higher than this share of it
RUNNER_UP_MS = 2.0
FRACTION_STEPS = 17  # the move is measured to 1/16 sample
CALIBRATION_MATCH = 0.7  # before the resume, the filter's prediction must match the uplink this well
CHUNK = 160  # ... judged by 10 ms chunk:
MIN_CALIBRATION_CHUNKS = 20  # ... at least this many with echo predicted (over ECHO_FLOOR_RMS)
OUTLIER = 0.5  # ... of which a chunk the prediction leaves over half of is the user's (left out)
KEPT_SHARE = 0.5  # ... and at least this share must be the echo alone
# while the move is not measured, a window of uplink that the prediction at every move leaves more than
# this share of (-3 dB; the echo alone at its move: ~-15 dB, Opus) is the user's (`unexplained`) ...
UNEXPLAINED = 0.5
EXPLAIN_CHUNKS = 3  # ... judged over this many 10 ms chunks (one chunk of speech may match by chance)
TALK_FLOOR_RMS = 100.0  # ... where the uplink is this loud (-50 dBFS)
BEFORE_MS = 300.0  # ... the echo of what played this long before the resume moved with it


class ShiftFinder:
    """The echo's move at a resume, for a stage aligned to `delay_ms` (its reference read
    `lead_ms` ahead) whose filter has impulse response `response` (SpeexDSP's units)."""

    def __init__(
        self,
        read: Callable[[float, int], np.ndarray],
        response: np.ndarray,
        *,
        delay_ms: float,
        lead_ms: float,
        resumed_ms: float,
    ) -> None:
        self._read = read
        self._response = response.astype(np.float64)
        self._scale: float | None = None
        self.delay_ms = delay_ms
        self._lead_ms = lead_ms
        self.resumed_ms = resumed_ms
        # capture time at which the echo of the resumed playback would start, had it not moved
        self.echo_ms = resumed_ms + delay_ms - lead_ms
        self.shift_ms: float | None = None

    @property
    def start_ms(self) -> float:
        """The uplink needed from this capture time on (`find`)."""
        return self.echo_ms + MIN_SHIFT_MS

    def calibrate(self, mic: np.ndarray, capture_ms: float) -> bool:
        """Scales the response from uplink captured from `capture_ms` on (before the resume):
        least squares of the filter's prediction against it. False where the prediction does not
        match that uplink (the filter is no good for this)."""
        aligned = self._read(
            capture_ms - self.delay_ms + self._lead_ms - self._span_ms(), mic.size + self._taps
        )
        predicted = _convolve(aligned.astype(np.float64), self._response)[self._taps : self._taps + mic.size]
        m = mic.astype(np.float64)
        # by 10 ms chunk: the user may have been talking over some of it, and their chunks, which
        # the prediction does not explain, are left out (a robust first scale says which)
        chunks = m.size // CHUNK
        if not chunks:
            return False
        mc = m[: chunks * CHUNK].reshape(chunks, CHUNK)
        pc = predicted[: chunks * CHUNK].reshape(chunks, CHUNK)
        pp, mp, mm = np.sum(pc * pc, axis=1), np.sum(mc * pc, axis=1), np.sum(mc * mc, axis=1)
        some = pp > 0
        if some.sum() < MIN_CALIBRATION_CHUNKS:
            return False
        first = float(np.median(mp[some] / pp[some]))
        echo = first**2 * pp > ECHO_FLOOR_RMS**2 * CHUNK  # (the response is in SpeexDSP's units)
        if echo.sum() < MIN_CALIBRATION_CHUNKS:
            return False
        left = np.sum((mc - first * pc) ** 2, axis=1)
        kept = echo & (left < OUTLIER * mm)  # the prediction explains most of it: the echo alone
        if kept.sum() < KEPT_SHARE * echo.sum():
            return False
        power, cross, total = float(pp[kept].sum()), float(mp[kept].sum()), float(mm[kept].sum())
        match = cross / (np.sqrt(power * total) + 1e-9)
        if match < CALIBRATION_MATCH:
            return False
        self._scale = cross / power
        return True

    def find(self, mic: np.ndarray) -> float | None:
        """`mic`: the uplink captured from `start_ms` on. The echo's move (ms, later positive)
        once it is clear, else None (more uplink needed)."""
        if self._scale is None or mic.size < int((MIN_ECHO_MS - MIN_SHIFT_MS) * SAMPLES_PER_MS):
            return None
        n = mic.size
        m, q = self._apart(mic)
        # moves whose echo the uplink covers for MIN_ECHO_MS so far
        lags = min(int((MAX_SHIFT_MS - MIN_SHIFT_MS) * SAMPLES_PER_MS), n - int(MIN_ECHO_MS * SAMPLES_PER_MS))
        size = 1 << int(np.ceil(np.log2(2 * n)))
        spectrum = np.fft.rfft(m, size) * np.conj(np.fft.rfft(q, size))
        cross = np.fft.irfft(spectrum, size)[: lags + 1]  # index j: moved by MIN_SHIFT_MS + j samples
        whitened = np.fft.irfft(spectrum / (np.abs(spectrum) + 1e-9), size)[: lags + 1]
        q_energy = np.concatenate([[0.0], np.cumsum(q**2)])[n - np.arange(lags + 1)]
        m_energy = np.concatenate([np.cumsum((m**2)[::-1])[::-1], [0.0]])[np.arange(lags + 1)]
        j = int(np.argmax(whitened))
        covered = n - j  # uplink samples after the moved echo's start
        if covered < MIN_ECHO_MS * SAMPLES_PER_MS or q_energy[j] < ECHO_FLOOR_RMS**2 * covered:
            return None
        confidence = float(whitened[j] / (np.std(whitened) + 1e-12))
        away = int(RUNNER_UP_MS * SAMPLES_PER_MS)
        others = np.concatenate([whitened[: max(j - away, 0)], whitened[j + away + 1 :]])
        runner_up = float(others.max()) if others.size else 0.0
        gain = float(cross[j] / q_energy[j])
        match = float(cross[j] / (np.sqrt(q_energy[j] * m_energy[j]) + 1e-9))
        if (
            confidence < MIN_CONFIDENCE
            or runner_up > RUNNER_UP * whitened[j]
            or not GAIN_RANGE[0] <= gain <= GAIN_RANGE[1]
            or match < MIN_MATCH
        ):
            return None
        self.shift_ms = MIN_SHIFT_MS + (j + _fraction(spectrum, size, j)) / SAMPLES_PER_MS
        return self.shift_ms

    def _apart(self, mic: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The uplink from `start_ms` on less the echo of what played before the resume (which did
        not move), and the echo of what played after it, had it not moved (the calibrated filter's
        prediction from the resume on)."""
        n = mic.size
        assert self._scale is not None
        response = self._response * self._scale
        played = self._read(self.resumed_ms, n).astype(np.float64)  # what followed the resume
        q = _convolve(played, response)[:n]  # its echo, had it not moved
        # less the echo of what played before the resume, which did not move (the uplink from
        # start_ms on hears it up to the filter's span later)
        before_ms = self.start_ms - self.delay_ms + self._lead_ms - self._span_ms()
        before = self._read(before_ms, n + self._taps)
        before[min(max(int(round((self.resumed_ms - before_ms) * SAMPLES_PER_MS)), 0), before.size) :] = 0
        m = (
            mic.astype(np.float64)
            - _convolve(before.astype(np.float64), response)[self._taps : self._taps + n]
        )
        return m, q

    def unexplained(self, mic: np.ndarray, chunks: int) -> np.ndarray:
        """While the move is not measured yet: which of the last `chunks` 10 ms chunks of `mic` (the
        uplink from `start_ms` on) no move of the echo (of what played from BEFORE_MS before the
        resume on), from MIN_SHIFT_MS to however late, nor the echo unmoved, explains:
        over the chunk and the EXPLAIN_CHUNKS - 1 before it, the prediction moved by any of them and
        scaled within GAIN_RANGE leaves more than UNEXPLAINED of the uplink, which is loud
        (TALK_FLOOR_RMS). That is the user's speech (the echo, wherever it comes back, is what the
        filter predicts: ~-15 dB left), and the resume guard must not mute it: the user who talks
        right after a resume, while the device is still silent or before the move is clear, was
        found up to 0.8 s late (bench stall-plain-v1 seed 0).

        Hand-written on numpy's FFT (one correlation per chunk against the prediction at every
        move): neither library explains a chunk by a moved echo path."""
        out = np.zeros(chunks, bool)
        if self._scale is None or mic.size < chunks * CHUNK:
            return out
        # the echo of what played from BEFORE_MS before the resume on, moved as a whole: what played
        # after the resume moved, but so may the end of what played before it, where the device ran
        # dry before we expected it (bench stall-plain-v1 seed 2: that end, moved, was not the echo
        # of what played after the resume at any move, and passed as talk)
        before = int(BEFORE_MS * SAMPLES_PER_MS)
        played = self._read(self.resumed_ms - BEFORE_MS - self._span_ms(), mic.size + before + self._taps)
        q = _convolve(played.astype(np.float64), self._response * self._scale)[self._taps :]
        m = np.concatenate([np.zeros(before), mic.astype(np.float64)])  # the same time axis as q
        span = EXPLAIN_CHUNKS * CHUNK
        # every move from MIN_SHIFT_MS on whose echo reaches the last chunk: q moved by j samples
        size = 1 << int(np.ceil(np.log2(m.size + span)))  # no wrap-around: moves past the start see zeros
        q_spectrum = np.fft.rfft(q, size)
        q_energy = np.concatenate([[0.0], np.cumsum(q**2)])
        for c in range(chunks):
            end = m.size - (chunks - 1 - c) * CHUNK
            start = max(end - span, 0)
            w = m[start:end]
            power = float(np.dot(w, w))
            if power < TALK_FLOOR_RMS**2 * w.size:
                continue
            # cross[j] = sum_i w[i] q[start + i - j]: the window against the echo moved j samples on
            # from MIN_SHIFT_MS, for every move whose echo has begun by the window's end
            full = np.fft.irfft(q_spectrum * np.conj(np.fft.rfft(w, size)), size)
            j = np.arange(end)
            cross = full[(start - j) % size]
            lo, hi = np.clip(start - j, 0, q.size), np.clip(end - j, 0, q.size)
            energy = q_energy[hi] - q_energy[lo]
            gain = np.clip(cross / np.maximum(energy, 1e-9), *GAIN_RANGE)
            left = power - 2 * gain * cross + gain**2 * energy
            out[c] = float(left.min()) > UNEXPLAINED * power
        return out

    @property
    def _taps(self) -> int:
        return self._response.size

    def _span_ms(self) -> float:
        return self._taps / SAMPLES_PER_MS


def _fraction(spectrum: np.ndarray, size: int, j: int) -> float:
    """Where between j - 0.5 and j + 0.5 samples the cross-correlation (its `spectrum`) peaks:
    evaluated band-limited at FRACTION_STEPS points (a filter moved half a sample off leaves the
    top of the band: re-adapting, SpeexDSP lost 3-6 dB for a second after a move, bench)."""
    offsets = np.linspace(-0.5, 0.5, FRACTION_STEPS)
    k = np.arange(spectrum.size)
    phase = np.exp(2j * np.pi * np.outer(j + offsets, k) / size)
    weights = np.full(spectrum.size, 2.0)
    weights[0] = 1.0
    values = (phase * (weights * spectrum)).real.sum(axis=1)
    return float(offsets[int(np.argmax(values))])


def _convolve(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    size = 1 << int(np.ceil(np.log2(x.size + h.size)))
    return np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(h, size), size)[: x.size]
