"""SpeexDSP's linear echo canceller (MDF adaptive filter) over Debian's libspeexdsp.

Why it is here: WebRTC's AEC3 (canceller.py) cancels echo well, but its
residual-echo suppressor also takes 20-40 dB off the user's first syllables
when they talk over a loud reply (near end about as loud as the echo), so the
VAD misses the barge-in (scripts/bench_aec.py: 11-12 of 20 within 400 ms), and
the livekit binding exposes no AEC3 setting to make it less cautious. Speex's
MDF filter is linear only: it subtracts the echo it predicts and never
suppresses, so speech over the reply comes through whole. On a reference
pre-aligned by the measured delay it removes ~15 dB of echo from an Opus-coded
uplink (the codec's noise is the floor), and its echo estimate shows where the
user talks; there its output is used instead of AEC3's (stages.LinearStage).

Binding: ctypes over `libspeexdsp.so.1` (apt package libspeexdsp1), five C
functions; `cancel` runs a whole uplink frame's 10 ms chunks in one Python call. The PyPI bindings are unmaintained or build from source at install
(speexdsp 0.1.1, 2018, needs swig and a compiler; speexaec/pyspeexaec/
speexdsp-aec are single-author releases with no wheels history), so a thin
ctypes shim over the distribution's library is the smaller risk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import weakref

import numpy as np

_SET_SAMPLING_RATE = 24  # SPEEX_ECHO_SET_SAMPLING_RATE (speex/speex_echo.h)
_GET_IMPULSE_RESPONSE_SIZE = 27  # SPEEX_ECHO_GET_IMPULSE_RESPONSE_SIZE
_GET_IMPULSE_RESPONSE = 29  # SPEEX_ECHO_GET_IMPULSE_RESPONSE (int32 per tap)


class SpeexUnavailable(RuntimeError):
    """libspeexdsp is not installed (apt-get install libspeexdsp1)."""


@functools.cache
def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("speexdsp") or "libspeexdsp.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise SpeexUnavailable(f"cannot load libspeexdsp ({exc}); install the libspeexdsp1 package") from exc
    lib.speex_echo_state_init.restype = ctypes.c_void_p
    lib.speex_echo_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_echo_state_destroy.restype = None
    lib.speex_echo_state_destroy.argtypes = [ctypes.c_void_p]
    lib.speex_echo_state_reset.restype = None
    lib.speex_echo_state_reset.argtypes = [ctypes.c_void_p]
    lib.speex_echo_cancellation.restype = None
    lib.speex_echo_cancellation.argtypes = [ctypes.c_void_p] * 4
    lib.speex_echo_ctl.restype = ctypes.c_int
    lib.speex_echo_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    return lib


def speex_available() -> bool:
    try:
        _library()
    except SpeexUnavailable:
        return False
    return True


class SpeexEchoCanceller:
    """One MDF filter: `cancel(mic, ref)` on whole frames of `frame` int16 samples."""

    def __init__(self, *, frame: int, filter_length: int, rate: int = 16000) -> None:
        lib = _library()
        state = lib.speex_echo_state_init(frame, filter_length)
        if not state:
            raise SpeexUnavailable("speex_echo_state_init failed")
        self._lib, self._state, self.frame = lib, state, frame
        rate_arg = ctypes.c_int(rate)
        lib.speex_echo_ctl(state, _SET_SAMPLING_RATE, ctypes.byref(rate_arg))
        weakref.finalize(self, lib.speex_echo_state_destroy, state)

    def reset(self) -> None:
        """Forgets the adapted filter (the reference was moved)."""
        self._lib.speex_echo_state_reset(self._state)

    def impulse_response(self) -> np.ndarray:
        """The adapted filter's impulse response (int32 taps in the library's own scale: fit it)."""
        size = ctypes.c_int(0)
        self._lib.speex_echo_ctl(self._state, _GET_IMPULSE_RESPONSE_SIZE, ctypes.byref(size))
        taps = np.zeros(size.value, np.int32)
        self._lib.speex_echo_ctl(self._state, _GET_IMPULSE_RESPONSE, taps.ctypes.data)
        return taps

    def cancel(self, mic: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """`mic` less the echo of `ref` (int16, equal sizes, a multiple of `frame`), frame by frame."""
        if mic.size != ref.size or mic.size % self.frame:
            raise ValueError(f"speex frames are {self.frame} samples, got {mic.size} and {ref.size}")
        mic = np.ascontiguousarray(mic, np.int16)
        ref = np.ascontiguousarray(ref, np.int16)
        out = np.empty_like(mic)
        cancel, state, step = self._lib.speex_echo_cancellation, self._state, 2 * self.frame
        m, r, o = mic.ctypes.data, ref.ctypes.data, out.ctypes.data
        for offset in range(0, 2 * mic.size, step):  # byte offsets: int16 samples
            cancel(state, m + offset, r + offset, o + offset)
        return out
