"""Synthetic user speech for the tests and the benchmark: espeak-ng at 16 kHz.

`utterance()` puts silence (optionally with white noise) around spoken texts
and returns the int16 PCM with the sample range where the speech really is:
each synthesis is trimmed to its frames within 40 dB of its loudest frame, so
the silences are exactly as asked.
"""

from __future__ import annotations

import functools
import io
import subprocess
import wave
from dataclasses import dataclass

import numpy as np
import torch

from tts_engine.resample import resample

RATE = 16000


class SpeechSynthesisError(RuntimeError):
    """espeak-ng is missing or failed."""


@functools.cache
def _espeak(text: str, voice: str) -> np.ndarray:
    try:
        wav = subprocess.run(
            ["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SpeechSynthesisError(f"espeak-ng failed for {text!r}: {exc}") from exc
    with wave.open(io.BytesIO(wav)) as w:
        rate = w.getframerate()
        samples = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    wave_16k = resample(torch.from_numpy(samples.astype(np.float32) / 32768.0), rate, RATE)
    return wave_16k.numpy()


def speech(text: str, voice: str = "en") -> np.ndarray:
    """espeak-ng's float32 speech at 16 kHz (cached)."""
    return _espeak(text, voice).copy()


def speech_bounds(x: np.ndarray, *, floor_db: float = -40.0, frame: int = 160) -> tuple[int, int]:
    """First and last sample of the frames within `floor_db` of the loudest frame."""
    n = x.size // frame
    rms = np.sqrt(np.mean(np.square(x[: n * frame].reshape(n, frame).astype(np.float64)), axis=1)) + 1e-12
    loud = np.nonzero(20 * np.log10(rms / rms.max()) > floor_db)[0]
    return int(loud[0] * frame), int((loud[-1] + 1) * frame)


@dataclass
class Utterance:
    pcm: np.ndarray  # int16, 16 kHz
    start: int  # first sample of speech
    end: int  # sample after the last of speech

    @property
    def start_s(self) -> float:
        return self.start / RATE

    @property
    def end_s(self) -> float:
        return self.end / RATE


def utterance(
    texts: str | list[str],
    *,
    voice: str = "en",
    lead_s: float = 0.5,
    gap_s: float = 1.0,
    tail_s: float = 1.0,
    noise_dbfs: float | None = None,
    seed: int = 0,
) -> Utterance:
    """Silence, the text(s) spoken with `gap_s` between them, silence; optional white noise."""
    parts = [np.zeros(int(lead_s * RATE), np.float32)]
    for i, text in enumerate([texts] if isinstance(texts, str) else texts):
        if i:
            parts.append(np.zeros(int(gap_s * RATE), np.float32))
        spoken = speech(text, voice)
        s0, s1 = speech_bounds(spoken)
        parts.append(spoken[s0:s1])  # espeak's own silence trimmed: the gaps are as given
    start = parts[0].size
    end = sum(p.size for p in parts)
    parts.append(np.zeros(int(tail_s * RATE), np.float32))
    signal = np.concatenate(parts)
    if noise_dbfs is not None:
        rng = np.random.default_rng(seed)
        signal = signal + rng.standard_normal(signal.size).astype(np.float32) * 10 ** (noise_dbfs / 20)
    pcm = (np.clip(signal, -1.0, 1.0) * 32767).astype(np.int16)
    return Utterance(pcm, start, end)
