"""A chunk's power below BAND_HZ: the band where the uplink's Opus coding keeps the waveform.

Above ~4 kHz the codec keeps a band's energy but not its waveform, which no linear filter predicts, so
the linear stage's residual tests (gateway/aec/linear.py) weigh what its filter left below BAND_HZ. A
sibilant onset in the reply after a short pause left +4..+7 dB over the filter's estimate broadband
(the estimate 6-8 dB short; without the codec -25 dB) and passed as talk.
"""

from __future__ import annotations

import numpy as np

from gateway.aec.reference import RATE
from gateway.aec.stages import CHUNK

# the residual tests (talk, +5 dB) weigh what the filter left against its estimate below this: above
# ~4 kHz the uplink's Opus coding keeps a band's energy but not its waveform, which no linear filter
# predicts (the filter, echo alone, leaves +3..+10 dB there, -5..-25 dB below). A sibilant's onset
# after a pause, mostly over 4 kHz, was +4..+7 dB broadband and passed as talk (bench stall-room-v2
# seed 0, reply 4: a false barge-in); below 3 kHz the same chunks left -5..-8 dB
BAND_HZ = 3000.0

_WINDOW = np.hanning(2 * CHUNK)  # a chunk's band power: over the 20 ms ending with it
_IN_BAND = np.fft.rfftfreq(2 * CHUNK, 1 / RATE) < BAND_HZ
# per-sample power from the windowed spectrum's one-sided bins (Parseval, the Hann window's power)
_BAND_SCALE = 2.0 / ((2 * CHUNK) ** 2 * float(np.mean(_WINDOW**2)))


def band_power(signal: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Per 10 ms chunk of `signal`: its power below BAND_HZ (mean square per sample, as the chunk's
    own power), from the Hann-windowed 20 ms ending with the chunk (`before`: the CHUNK samples
    before `signal`). numpy's FFT: the libraries in (SpeexDSP, AEC3) give no band powers."""
    joined = np.concatenate([before, signal]).astype(np.float64)
    n = signal.size // CHUNK
    idx = np.arange(2 * CHUNK)[None, :] + CHUNK * np.arange(n)[:, None]
    spectrum = np.fft.rfft(joined[idx] * _WINDOW, axis=1)
    return _BAND_SCALE * np.sum(np.abs(spectrum[:, _IN_BAND]) ** 2, axis=1)
