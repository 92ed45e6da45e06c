"""The cancelling stages of a session's echo canceller: SpeexDSP's linear filter, then AEC3.

AEC3 (WebRTC's audio processing module through `livekit`'s
`rtc.AudioProcessingModule`, a manylinux wheel that runs locally, no LiveKit
server involved) removes the echo: its own delay search, adaptive filter and
residual-echo suppressor give 40+ dB of ERLE. It also suppresses the first
100-150 ms of speech that starts over a loud reply (see speex.py).
`aec-audio-processing` (another AEC3 binding) ships only an sdist that needs a
C++ toolchain at install. Both libraries work in 10 ms frames at 16 kHz.

`LinearStage` (experimental): SpeexDSP's linear filter on the uplink, beside
AEC3, given the reference pre-aligned by the measured delay. Its own echo
estimate (its input less its output) tells where the user talks: with the echo
alone a converged filter leaves ~25 dB under that estimate; where it leaves
more than -10 dB of it (and more than a floor), the 10 ms chunk is the user's
speech over the echo, and the linear output (speech whole, echo ~-25 dB) is
used instead of AEC3's (speech ducked). The filter must first have shown that
it converged, on live audio: a new stage is first run 3 times over the last
couple of seconds of uplink (`warm_up`; converged ~1.5-2 s into the first
reply instead of ~2.5-3), but a filter trained on little audio has not learnt
every sound of the reply yet and leaves loud echo where a new one comes (2-3
false barge-ins in 20 in the bench). So for its first 100 chunks with echo
after converging a chunk must also pass Geigel's test: the microphone peaks
above what the echo path usually makes of the reference's recent peak.

Tried and dropped: the linear filter in front of AEC3 (a cascade) found every
bench barge-in in time, but in the real-time loopback test
(tests/test_aec_session.py) timing jitter moved the echo against the aligned
reference and AEC3, adapted to the filter's small residual, let echo through:
false barge-ins in 3 of 6 runs.
"""

from __future__ import annotations

import logging
from collections import deque

import numpy as np
from livekit import rtc
from numpy.lib.stride_tricks import sliding_window_view

from gateway.aec.reference import RATE
from gateway.aec.speex import SpeexEchoCanceller, SpeexUnavailable

log = logging.getLogger(__name__)

CHUNK = RATE // 100  # both libraries take 10 ms frames
LINEAR_TAPS = 1024  # the linear filter: 64 ms of echo response from the aligned delay on
NEAR_FLOOR_RMS = 100.0  # double talk needs this much left after the linear filter (-50 dBFS)
ECHO_FLOOR_RMS = 100.0  # chunks with this much predicted echo tell how well the linear stage cancels
CONVERGED_DB = -18.0  # ... it has converged when 3 in 4 of them left less than this
NEAR_TO_ECHO = 0.1  # ... and at least this share of the echo's power it predicted (-10 dB; echo alone: ~-25)
PROVEN_CHUNKS = 100  # a filter converged for this many chunks with echo no longer needs Geigel's test
GEIGEL_CHUNKS = 7  # the reference's recent peak: over the filter's span (64 ms + LEAD_MS)
GEIGEL_REF_FLOOR = 1000.0  # ... learnt from chunks whose reference peaked above this (-30 dBFS)
GEIGEL_MARGIN = 0.7  # ... double talk peaks above this times the echo path's usual peak gain
LEAD_MS = 10.0  # the aligned reference runs this far ahead of the echo (estimate error; causal filter)


class Aec3:
    """WebRTC's AEC3 on the uplink: finds the delay itself, adapts, suppresses the residual."""

    def __init__(self) -> None:
        self._apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)

    def run(self, mic: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """Cleans `mic` against `ref` (same length, int16); a trailing part under 10 ms passes as it is."""
        out = mic.copy()
        for i in range(0, mic.size - CHUNK + 1, CHUNK):
            far = rtc.AudioFrame(ref[i : i + CHUNK].tobytes(), RATE, 1, CHUNK)
            self._apm.process_reverse_stream(far)
            near = rtc.AudioFrame(mic[i : i + CHUNK].tobytes(), RATE, 1, CHUNK)
            self._apm.set_stream_delay_ms(0)  # AEC3 estimates the delay itself
            self._apm.process_stream(near)
            out[i : i + CHUNK] = np.frombuffer(near.data, np.int16)
        return out


class LinearStage:
    """SpeexDSP's linear filter on a reference aligned to `delay_ms`, and the double-talk test."""

    def __init__(self, delay_ms: float) -> None:
        self.delay_ms = delay_ms
        self._speex = SpeexEchoCanceller(frame=CHUNK, filter_length=LINEAR_TAPS, rate=RATE)
        self._left_db: deque[float] = deque(maxlen=100)  # left / echo of recent 10 ms chunks with echo
        self._gains: deque[float] = deque(maxlen=300)  # mic peak / recent reference peak, echo alone
        self._ref_peaks = np.zeros(GEIGEL_CHUNKS - 1)
        self._proven = 0  # chunks with echo seen since the filter first showed it converged

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
        self._left_db.clear()
        self._proven = 0

    @property
    def converged(self) -> bool:
        """The filter has shown it cancels: 3 in 4 of the recent chunks with echo left well under it."""
        return len(self._left_db) >= self._left_db.maxlen // 2 and (
            float(np.percentile(self._left_db, 25)) < CONVERGED_DB
        )

    def run(self, mic: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The linear filter's output for the whole 10 ms chunks of `mic`, and which are double talk."""
        whole = mic.size - mic.size % CHUNK
        linear = np.empty(whole, np.int16)
        for i in range(0, whole, CHUNK):
            linear[i : i + CHUNK] = self._speex.cancel(mic[i : i + CHUNK], ref[i : i + CHUNK])
        if not whole:
            return linear, np.zeros(0, bool)
        return linear, self._double_talk(mic[:whole], ref[:whole], linear)

    def _double_talk(self, mic: np.ndarray, ref: np.ndarray, linear: np.ndarray) -> np.ndarray:
        """Per 10 ms chunk: what the linear filter left is loud against the echo it predicted.

        Only once the filter has shown it cancels (3 in 4 of the recent chunks with echo in
        them left well under the echo): an unconverged filter leaves echo, not speech.
        """
        left = np.mean(linear.astype(np.float64).reshape(-1, CHUNK) ** 2, axis=1)
        echo = np.mean((mic.astype(np.float64) - linear).reshape(-1, CHUNK) ** 2, axis=1)
        # Geigel's test beside it: the microphone peaks above anything the echo path has made of the
        # reference's loudest recent sample (a filter that has not learnt a sound yet leaves echo
        # that passes the first test, not this one)
        mic_peak = np.abs(mic.reshape(-1, CHUNK)).max(axis=1).astype(np.float64)
        peaks = np.concatenate([self._ref_peaks, np.abs(ref.reshape(-1, CHUNK)).max(axis=1)])
        window = sliding_window_view(peaks, GEIGEL_CHUNKS).max(axis=1) + 1.0
        self._ref_peaks = peaks[-(GEIGEL_CHUNKS - 1) :]
        gain = mic_peak / window
        talk = (left > NEAR_FLOOR_RMS**2) & (left > echo * NEAR_TO_ECHO)
        if not self.converged or not self._gains:
            talk[:] = False
        elif self._proven < PROVEN_CHUNKS:
            talk &= gain > GEIGEL_MARGIN * float(np.percentile(self._gains, 95))
        with_echo = (echo > ECHO_FLOOR_RMS**2) & ~talk  # the user's speech says nothing of the filter
        self._left_db.extend(10 * np.log10(np.maximum(left[with_echo], 1.0) / echo[with_echo]))
        self._gains.extend(gain[with_echo & (window > GEIGEL_REF_FLOOR)])
        if self.converged:
            self._proven += int(with_echo.sum())
        return talk
