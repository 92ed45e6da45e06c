"""WebRTC's AEC3, the canceller's main stage (the linear stage beside it: linear.py).

AEC3 (WebRTC's audio processing module through `livekit`'s
`rtc.AudioProcessingModule`, a manylinux wheel that runs locally, no LiveKit
server involved) removes the echo: its own delay search, adaptive filter and
residual-echo suppressor give 40+ dB of ERLE. It also suppresses the first
100-150 ms of speech that starts over a loud reply (see speex.py), and, where
there is little or no echo for its filter to converge on, whatever the
microphone hears while we play (guard.py: the echo ceiling).
`aec-audio-processing` (another AEC3 binding) ships only an sdist that needs a
C++ toolchain at install. Both libraries work in 10 ms frames at 16 kHz.
"""

from __future__ import annotations

import numpy as np
from livekit import rtc

from gateway.aec.reference import RATE

CHUNK = RATE // 100  # both libraries take 10 ms frames


class Aec3:
    """WebRTC's AEC3 on the uplink: finds the delay itself, adapts, suppresses the residual."""

    def __init__(self) -> None:
        self._apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)
        # AEC3 estimates the delay itself; set once (each call is an FFI round trip, ~12 % of AEC3's cost)
        self._apm.set_stream_delay_ms(0)

    def run(self, mic: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """Cleans `mic` against `ref` (same length, int16); a trailing part under 10 ms passes as it is."""
        out = mic.copy()
        for i in range(0, mic.size - CHUNK + 1, CHUNK):
            far = rtc.AudioFrame(ref[i : i + CHUNK].tobytes(), RATE, 1, CHUNK)
            self._apm.process_reverse_stream(far)
            near = rtc.AudioFrame(mic[i : i + CHUNK].tobytes(), RATE, 1, CHUNK)
            self._apm.process_stream(near)
            out[i : i + CHUNK] = np.frombuffer(near.data, np.int16)
        return out
