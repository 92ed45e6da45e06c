"""Centered STFT / iSTFT of the HiFT decoder, batched with per-row lengths.

Both mirror ``torch.stft`` / ``torch.istft`` with ``center=True`` (reflect padding of ``n_fft // 2``) and
a periodic Hann window computed in float64 and rounded to float32 (what ``scipy.signal.get_window`` gives
upstream). Rows of a padded batch are treated as if run alone: the reflect padding happens at each
row's own end, and the iSTFT window envelope only counts each row's own frames. The iSTFT is written out
(irfft, window, overlap-add with the same aten op ``torch.istft`` uses, divide by the envelope) so that it
needs no host sync and supports per-row frame counts. Spectral work is always float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SpectralCodec"]

SPECTRAL_DTYPE = torch.float32


class SpectralCodec(nn.Module):
    def __init__(self, n_fft: int, hop_len: int) -> None:
        super().__init__()
        self.n_fft = n_fft
        self.hop_len = hop_len
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64).to(SPECTRAL_DTYPE)
        self.register_buffer("window", window, persistent=False)  # [n_fft]

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> nn.Module:
        device = fn(torch.empty(0, dtype=SPECTRAL_DTYPE)).device  # follow device moves only
        return super()._apply(lambda t: t.to(device=device, dtype=SPECTRAL_DTYPE), recurse)

    def _reflect_pad(self, x: torch.Tensor, lengths: Sequence[int] | None) -> torch.Tensor:
        pad = self.n_fft // 2
        if lengths is None or all(n == x.shape[1] for n in lengths):
            return F.pad(x[:, None], (pad, pad), mode="reflect")[:, 0]  # [B, L + 2 * pad]
        n = torch.tensor(lengths, device=x.device)[:, None]  # [B, 1]
        src = torch.arange(-pad, x.shape[1] + pad, device=x.device)[None, :].abs()  # [1, L + 2 * pad]
        src = torch.where(src > n - 1, 2 * (n - 1) - src, src)  # reflect at each row's end: [B, L + 2p]
        src = src.clamp(0, x.shape[1] - 1)  # beyond a row's padding: any valid index (never used)
        return torch.gather(x, 1, src)  # [B, L + 2 * pad]

    def stft(self, x: torch.Tensor, lengths: Sequence[int] | None = None) -> torch.Tensor:
        """x [B, L] -> [B, n_fft + 2, L // hop + 1]: real parts then imaginary parts of the bins."""
        x = self._reflect_pad(x.to(SPECTRAL_DTYPE), lengths)  # [B, L + n_fft]
        spec = torch.stft(
            x,
            self.n_fft,
            self.hop_len,
            self.n_fft,
            window=self.window,
            center=False,
            return_complex=True,
        )  # [B, n_fft // 2 + 1, frames]
        return torch.cat([spec.real, spec.imag], dim=1)  # [B, n_fft + 2, frames]

    def istft(
        self, magnitude: torch.Tensor, phase: torch.Tensor, num_frames: Sequence[int] | None = None
    ) -> torch.Tensor:
        """magnitude, phase [B, n_fft // 2 + 1, F] -> [B, hop * (F - 1)]; row i uses ``num_frames[i]``."""
        magnitude = torch.clip(magnitude.to(SPECTRAL_DTYPE), max=1e2)
        phase = phase.to(SPECTRAL_DTYPE)
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))  # [B, K, F]
        batch, _, total = spec.shape
        frames = torch.fft.irfft(spec.transpose(1, 2), self.n_fft, dim=-1)  # [B, F, n_fft]
        frames = frames * self.window.view(1, 1, self.n_fft)  # [B, F, n_fft]
        window_sq = self.window.pow(2).expand(1, total, self.n_fft)  # [1, F, n_fft]
        if num_frames is not None and any(n != total for n in num_frames):
            valid = (
                torch.arange(total, device=spec.device)[None, :]
                < torch.tensor(num_frames, device=spec.device)[:, None]
            )  # [B, F]
            frames = frames * valid[:, :, None]  # [B, F, n_fft]
            window_sq = window_sq * valid[:, :, None]  # [B, F, n_fft]
        length = self.n_fft + self.hop_len * (total - 1)
        y = torch.ops.aten.unfold_backward(frames, [batch, length], 1, self.n_fft, self.hop_len)  # [B, len]
        envelope = torch.ops.aten.unfold_backward(
            window_sq, [window_sq.shape[0], length], 1, self.n_fft, self.hop_len
        )  # [1|B, len]
        pad = self.n_fft // 2
        y = y[:, pad : length - pad]  # [B, hop * (F - 1)]
        envelope = envelope[:, pad : length - pad]  # [1|B, hop * (F - 1)]
        return y / envelope.clamp_min(1e-11)  # zero envelope only outside every row's frames
