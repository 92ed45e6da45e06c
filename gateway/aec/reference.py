"""The echo reference: the audio the device plays, placed on its play timeline.

Downlink frames are decoded from the very Opus packets we send (at 16 kHz, the
uplink's rate: libopus decodes to any of its rates, so no resampling is
needed, and the codec's own artefacts are in the reference just as they are in
the device's loudspeaker). Each frame is placed where the device will play it:
the device plays frames back to back from a queue, so a frame starts at the
later of "now" and the end of the previous one, the same model as the pacer's.
Times are milliseconds on the session's monotonic clock; the buffer keeps the
last few seconds, and anything not sent reads as silence.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from audio_codecs.opus import OpusDecodeError, OpusDecoder

RATE = 16000
SAMPLES_PER_MS = RATE // 1000
SINC_HALF = 16  # read_delayed's interpolator: 33 taps


class EchoReference:
    def __init__(self, *, keep_s: float = 6.0) -> None:
        self._ring = np.zeros(int(keep_s * RATE), np.int16)
        self._end = 0  # absolute sample index after the last written sample
        self._decoder = OpusDecoder(RATE)
        self.play_end_ms = 0.0  # when the device will have played everything sent so far
        # where playback resumed after running dry (ms): the device's pause there may have been a few
        # ms longer or shorter than ours (delivery jitter), so the echo may sit elsewhere after it
        self.resumes: deque[float] = deque(maxlen=32)

    def add_packet(self, packet: bytes, now_ms: float) -> float:
        """Records one downlink Opus packet; returns its play start (ms)."""
        try:
            pcm = self._decoder.decode(packet)
        except OpusDecodeError:
            return max(now_ms, self.play_end_ms)  # cannot happen for our own packets
        return self.add_pcm(pcm, now_ms)

    def add_pcm(self, pcm: np.ndarray, now_ms: float) -> float:
        start_ms = max(now_ms, self.play_end_ms)
        if start_ms > self.play_end_ms:
            self.resumes.append(start_ms)
        self.play_end_ms = start_ms + pcm.size / SAMPLES_PER_MS
        self._write(int(round(start_ms * SAMPLES_PER_MS)), pcm.astype(np.int16, copy=False))
        return start_ms

    def read(self, start_ms: float, count: int) -> np.ndarray:
        """`count` samples from `start_ms` on (silence where nothing played)."""
        start = int(round(start_ms * SAMPLES_PER_MS))
        out = np.zeros(count, np.int16)
        size = self._ring.size
        lo, hi = max(start, self._end - size, 0), min(start + count, self._end)
        if hi > lo:
            idx = np.arange(lo, hi) % size
            out[lo - start : hi - start] = self._ring[idx]
        return out

    def read_delayed(self, start_ms: float, count: int, delay: float) -> np.ndarray:
        """`read`, `delay` samples (|delay| <= 1) later: windowed-sinc interpolation over
        2 * SINC_HALF + 1 samples (neither AEC library moves a signal by part of a sample; the
        linear stage's filter, moved with the echo, needs it: gateway/aec/shift.py)."""
        if not delay:
            return self.read(start_ms, count)
        wide = self.read(start_ms - SINC_HALF / SAMPLES_PER_MS, count + 2 * SINC_HALF).astype(np.float64)
        k = np.arange(-SINC_HALF, SINC_HALF + 1)
        taps = np.sinc(k - delay) * np.blackman(k.size + 2)[1:-1]
        moved = np.convolve(wide, taps / taps.sum(), mode="valid")
        return np.clip(np.round(moved), -32768, 32767).astype(np.int16)

    def _write(self, start: int, pcm: np.ndarray) -> None:
        size = self._ring.size
        if start > self._end:  # a pause in playback: silence in between
            gap = np.arange(self._end, start)[-size:]
            self._ring[gap % size] = 0
        pcm = pcm[-size:]
        self._ring[np.arange(start, start + pcm.size) % size] = pcm
        self._end = max(self._end, start + pcm.size)
