"""Neural-source-filter excitation of the causal HiFT (upstream ``SourceModuleHnNSF`` + causal ``SineGen2``).

Per mel frame with f0 ``f`` and harmonic ``k = 1..H``: ``rad = (f * k / sr) % 1``;
``phase = cumsum(rad) * 2 * pi`` (float32 output of a running sum over the whole utterance);
``sine = 0.1 * sin(phase * S)`` with S samples per frame, held constant over the frame's S samples;
``uv = f > threshold``. Per sample ``n``: ``x = sine * uv + amp(uv) * noise[n]`` with the fixed uniform
noise buffer indexed by the absolute sample, ``amp = uv * sigma + (1 - uv) * alpha / 3``; and the
excitation is ``tanh(Linear(H, 1)(x))``.

Upstream computes ``rad`` per sample, adds ``rand_ini`` at sample 0, and decimates with linear
interpolation (scale 1/S, align_corners False). That interpolation reads samples ``S*i + S/2 - 1`` and
``S*i + S/2`` with weights of exactly 0.5 (exact in float32 below ~35000 frames), which hold the same
value, so it returns the per-frame ``rad`` bit for bit and sample 0 (hence ``rand_ini``) is never read.
We therefore work per frame. The CPU float32 ``cumsum`` accumulates in float64 and rounds each output;
we run it in float64 and round, which is bit-identical on CPU, close on GPU, and lets a caller resume the
running sum from a saved float64 state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from cosyvoice.hift.buffers import HiftNoiseBuffers
from cosyvoice.hift.errors import HiftInputError

__all__ = ["PhaseResume", "SourceModule"]

SOURCE_DTYPE = torch.float32


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseResume:
    """Restart row b's running rad sum at window frame ``frames[b]`` from ``values[b]``.

    ``values`` [B, H] float64 is the running sum of the frames before ``frames[b]`` (as returned by an
    earlier call). From that frame on the sum is accumulated sequentially from the value, as one call over
    the whole utterance would; frames before it keep a plain sum (a caller treats them as context).
    """

    values: torch.Tensor  # [B, H] float64
    frames: Sequence[int]

    def apply(self, rad64: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
        batch, num_frames, _ = rad64.shape
        if self.values.shape != (batch, rad64.shape[2]) or len(self.frames) != batch:
            raise HiftInputError(f"phase resume needs values [{batch}, {rad64.shape[2]}] and {batch} frames")
        if min(self.frames) < 0 or max(self.frames) > num_frames:
            raise HiftInputError(f"phase resume frames {list(self.frames)} outside 0..{num_frames}")
        device = rad64.device
        start = torch.tensor(list(self.frames), device=device)[:, None]  # [B, 1]
        step = torch.arange(num_frames, device=device)[None, :]  # [1, T]
        shifted = torch.gather(
            rad64, 1, (start + step).clamp(max=num_frames - 1)[:, :, None].expand_as(rad64)
        )
        # row b left-aligned at its resume frame: [B, T, H]
        resumed = torch.cumsum(torch.cat([self.values.to(rad64)[:, None], shifted], dim=1), dim=1)
        # [B, 1 + T, H]: resumed[b, j] = sum before frame start_b + j
        index = (step - start + 1).clamp(min=0)  # [B, T]
        resumed = torch.gather(resumed, 1, index[:, :, None].expand_as(rad64))  # [B, T, H]
        return torch.where((step >= start)[:, :, None], resumed, running)  # [B, T, H]


class SourceModule(nn.Module):
    """f0 per frame -> excitation per sample; float32 whatever dtype the vocoder is cast to."""

    def __init__(
        self,
        *,
        num_harmonics: int,
        sampling_rate: int,
        samples_per_frame: int,
        sine_amp: float,
        noise_std: float,
        voiced_threshold: float,
        buffers: HiftNoiseBuffers,
    ) -> None:
        super().__init__()
        self.num_harmonics = num_harmonics  # H, fundamental included (nb_harmonics + 1)
        self.sampling_rate = sampling_rate
        self.samples_per_frame = samples_per_frame
        self.sine_amp = sine_amp
        self.noise_std = noise_std
        self.voiced_threshold = voiced_threshold
        self.l_linear = nn.Linear(num_harmonics, 1)
        if buffers.sine_noise.shape[-1] != num_harmonics:
            raise HiftInputError(
                f"noise buffer has {buffers.sine_noise.shape[-1]} harmonics, expected {num_harmonics}"
            )
        # Kept for fidelity with the official module; provably never reaches the output (module doc).
        self.register_buffer("rand_ini", buffers.rand_ini.to(SOURCE_DTYPE), persistent=False)  # [1, H]
        self.register_buffer("sine_noise", buffers.sine_noise[0].to(SOURCE_DTYPE), persistent=False)  # [N, H]
        self.register_buffer(
            "harmonics", torch.arange(1, num_harmonics + 1, dtype=SOURCE_DTYPE), persistent=False
        )  # [H]

    @property
    def max_samples(self) -> int:
        return self.sine_noise.shape[0]

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> nn.Module:
        device = fn(torch.empty(0, dtype=SOURCE_DTYPE)).device  # follow device moves only
        return super()._apply(lambda t: t.to(device=device, dtype=SOURCE_DTYPE), recurse)

    def _noise(self, num_frames: int, sample_offsets: Sequence[int] | None, batch: int) -> torch.Tensor:
        num_samples = num_frames * self.samples_per_frame
        offsets = [0] if sample_offsets is None else list(sample_offsets)
        if sample_offsets is not None and len(offsets) != batch:
            raise HiftInputError(f"got {len(offsets)} sample offsets for a batch of {batch}")
        if min(offsets) < 0 or max(offsets) + num_samples > self.max_samples:
            raise HiftInputError(
                f"source needs noise samples up to {max(offsets) + num_samples}, the buffer holds "
                f"{self.max_samples} ({self.max_samples / self.sampling_rate:.1f} s)"
            )
        if all(offset == offsets[0] for offset in offsets):
            start = offsets[0]
            return self.sine_noise[None, start : start + num_samples]  # [1, L, H]
        index = torch.tensor(offsets, device=self.sine_noise.device)[:, None] + torch.arange(
            num_samples, device=self.sine_noise.device
        )  # [B, L]
        return self.sine_noise[index]  # [B, L, H]

    def forward(
        self,
        f0: torch.Tensor,
        *,
        sample_offsets: Sequence[int] | None = None,
        phase_resume: PhaseResume | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """f0 [B, T] -> (excitation [B, 1, T*S] float32, running rad sum [B, T, H] float64).

        ``sample_offsets`` (per row) index the noise buffer, 0 for an utterance's first frame;
        ``phase_resume`` restarts each row's running sum at a given frame (see :class:`PhaseResume`).
        """
        batch, num_frames = f0.shape
        f0 = f0.to(SOURCE_DTYPE)[:, :, None]  # [B, T, 1]
        rad = (f0 * self.harmonics / self.sampling_rate) % 1  # [B, T, H]
        running = torch.cumsum(rad.to(torch.float64), dim=1)  # [B, T, H]
        if phase_resume is not None:
            running = phase_resume.apply(rad.to(torch.float64), running)  # [B, T, H]
        phase = running.to(SOURCE_DTYPE) * 2 * math.pi  # [B, T, H]
        sine = torch.sin(phase * self.samples_per_frame) * self.sine_amp  # [B, T, H]
        uv = (f0 > self.voiced_threshold).to(SOURCE_DTYPE)  # [B, T, 1]
        amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3  # [B, T, 1]
        noise = self._noise(num_frames, sample_offsets, batch)  # [B|1, T*S, H]
        noise = noise.reshape(noise.shape[0], num_frames, self.samples_per_frame, self.num_harmonics)
        # [B|1, T, S, H]
        x = (sine * uv)[:, :, None, :] + amp[:, :, None, :] * noise  # [B, T, S, H]
        source = torch.tanh(self.l_linear(x))  # [B, T, S, 1]
        return source.reshape(batch, 1, num_frames * self.samples_per_frame), running  # [B, 1, L]
