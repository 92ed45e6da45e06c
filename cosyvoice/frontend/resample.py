"""Band-limited resampling with the same kernel as torchaudio's default ``Resample``.

The official frontend resamples every prompt copy (16 kHz for the speech tokenizer and CAM++, 24 kHz
for the flow mel) straight from the file's rate with torchaudio's default: windowed sinc, Hann
window, 6 zero crossings, rolloff 0.99. This module computes that polyphase kernel itself: for the
reduced ratio ``orig:new`` (divided by their gcd), output phase ``j`` uses the taps
``sinc(base * (i/orig - j/new)) * hann`` with ``base = min(orig, new) * rolloff``, and the output
length is ``ceil(new * N / orig)``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor

__all__ = ["ResampleError", "resample"]

LOWPASS_FILTER_WIDTH = 6
ROLLOFF = 0.99


class ResampleError(ValueError):
    """Invalid sample rates or waveform shape."""


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int) -> tuple[Tensor, int]:
    """Polyphase kernel ``[new, 1, 2 * width + orig]`` (float32, CPU) and its half-width."""
    base = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_FILTER_WIDTH * orig / base)
    taps = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig  # [1, 1, K]
    # the reference computes the output phases in float32 (only the taps are float64)
    phases = (torch.arange(0, -new, -1, dtype=torch.float32) / new).double()[:, None, None]  # [new, 1, 1]
    t = ((phases + taps) * base).clamp(-LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)  # [new, 1, K]
    window = torch.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / torch.where(t == 0, torch.ones_like(t), t))
    return (sinc * window * (base / orig)).float(), width


def resample(wave: Tensor, orig_sr: int, new_sr: int) -> Tensor:
    """Resample ``[..., N]`` float audio from ``orig_sr`` to ``new_sr`` -> ``[..., ceil(new * N / orig)]``."""
    if not (isinstance(orig_sr, int) and isinstance(new_sr, int)) or orig_sr <= 0 or new_sr <= 0:
        raise ResampleError(f"sample rates must be positive integers, got {orig_sr} and {new_sr}")
    if not isinstance(wave, Tensor) or wave.dim() == 0 or not wave.is_floating_point():
        raise ResampleError("expected a float waveform tensor [..., N]")
    if orig_sr == new_sr:
        return wave
    divisor = math.gcd(orig_sr, new_sr)
    orig, new = orig_sr // divisor, new_sr // divisor
    kernel, width = _sinc_kernel(orig, new)
    kernel = kernel.to(device=wave.device, dtype=wave.dtype)
    shape = wave.shape
    length = shape[-1]
    flat = wave.reshape(-1, 1, length)  # [B, 1, N]
    flat = torch.nn.functional.pad(flat, (width, width + orig))  # [B, 1, N + 2 width + orig]
    out = torch.nn.functional.conv1d(flat, kernel, stride=orig)  # [B, new, frames]
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)  # [B, new * frames], phases interleaved
    target = math.ceil(new * length / orig)
    return out[:, :target].reshape(*shape[:-1], target)  # [..., target]
