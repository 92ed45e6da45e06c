"""The fixed "random" buffers of the causal HiFT source module, regenerated exactly.

The official causal vocoder draws its noise once, at construction, from the global CPU generator:
``rand_ini = rand(1, 9)`` (column 0 zeroed), ``sine_waves = rand(1, 300 * 24000, 9)`` (uniform, not
Gaussian), then the default init of ``Linear(9, 1)``, then ``uv = rand(1, 300 * 24000, 1)`` (feeds an
unused branch). Which numbers come out depends on the generator state at that point, which the official
construction order fixes: the flow CFM reseeds with 0 and draws its noise ``randn(1, 80, 15000)``, then
the flow's ``Embedding(vocab, mel)`` and ``Linear(spk, mel)`` and the f0 predictor's five ``Conv1d`` and
its ``Linear`` take their default inits (weight norm draws nothing). We replay that sequence on a private
``torch.Generator`` (never the global one) to recover the state, then draw the buffers.

The CPU uniform kernel fills tensors serially, so a shorter ``sine_noise`` is an exact prefix of the full
300 s buffer: callers may keep only the length they need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cosyvoice.hift.errors import HiftError

__all__ = [
    "FULL_NOISE_SAMPLES",
    "HiftNoiseBuffers",
    "hift_buffers_from_rng_state",
    "official_flow_noise",
    "official_hift_rng_state",
]

FULL_NOISE_SAMPLES = 300 * 24000  # upstream hard-codes 300 s at 24 kHz


@dataclass(frozen=True, slots=True, kw_only=True)
class HiftNoiseBuffers:
    rand_ini: torch.Tensor  # [1, H] initial phase per harmonic, column 0 is 0
    sine_noise: torch.Tensor  # [1, N, H] uniform [0, 1) additive noise, indexed by absolute sample
    uv_noise: torch.Tensor | None  # [1, N_full, 1] the unused noise branch (only drawn on request)


def _default_linear_init(generator: torch.Generator, out_features: int, fan_in: int, *kernel: int) -> None:
    """Consume the draws of nn.Linear / nn.Conv1d ``reset_parameters`` (kaiming_uniform_ + bias)."""
    weight = torch.empty(out_features, fan_in, *kernel)  # [out, in, *k]
    torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
    bound = 1.0 / math.sqrt(fan_in * math.prod(kernel))
    torch.nn.init.uniform_(torch.empty(out_features), -bound, bound, generator=generator)


def official_flow_noise(*, mel_dim: int = 80, frames: int = 15000, seed: int = 0) -> torch.Tensor:
    """The CFM noise buffer: ``manual_seed(seed); randn(1, mel_dim, frames)`` on the CPU generator."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(1, mel_dim, frames, generator=generator)  # [1, mel, frames]


def official_hift_rng_state(
    *,
    flow_vocab_size: int,
    flow_mel_dim: int,
    spk_embed_dim: int,
    f0_in_channels: int,
    f0_cond_channels: int,
    f0_num_class: int = 1,
    flow_noise_frames: int = 15000,
    flow_noise_seed: int = 0,
) -> torch.Tensor:
    """CPU generator state (uint8 blob) right before the official HiFT draws ``rand_ini``."""
    generator = torch.Generator(device="cpu").manual_seed(flow_noise_seed)
    torch.randn(1, flow_mel_dim, flow_noise_frames, generator=generator)  # CFM noise
    torch.nn.init.normal_(torch.empty(flow_vocab_size, flow_mel_dim), generator=generator)  # Embedding
    _default_linear_init(generator, flow_mel_dim, spk_embed_dim)  # spk_embed_affine_layer
    _default_linear_init(generator, f0_cond_channels, f0_in_channels, 4)  # condnet[0], k=4
    for _ in range(4):
        _default_linear_init(generator, f0_cond_channels, f0_cond_channels, 3)  # condnet[2,4,6,8], k=3
    _default_linear_init(generator, f0_num_class, f0_cond_channels)  # classifier
    return generator.get_state()


def hift_buffers_from_rng_state(
    state: torch.Tensor,
    *,
    num_harmonics: int = 9,
    num_samples: int = FULL_NOISE_SAMPLES,
    with_uv: bool = False,
) -> HiftNoiseBuffers:
    """Draw the HiFT buffers from a CPU generator state (``torch.get_rng_state()`` layout).

    ``num_samples`` truncates ``sine_noise`` (an exact prefix of the full buffer). ``with_uv`` also draws
    the unused ``uv`` buffer, which needs the full sine buffer drawn first.
    """
    if state.dtype != torch.uint8 or state.dim() != 1:
        raise HiftError(f"rng state must be a 1-D uint8 tensor, got {tuple(state.shape)} {state.dtype}")
    if not 0 < num_samples <= FULL_NOISE_SAMPLES:
        raise HiftError(f"num_samples must be in 1..{FULL_NOISE_SAMPLES}, got {num_samples}")
    generator = torch.Generator(device="cpu")
    generator.set_state(state.cpu())
    rand_ini = torch.rand(1, num_harmonics, generator=generator)  # [1, H]
    rand_ini[:, 0] = 0
    drawn = FULL_NOISE_SAMPLES if with_uv else num_samples
    sine_noise = torch.rand(1, drawn, num_harmonics, generator=generator)  # [1, N, H]
    uv_noise = None
    if with_uv:
        _default_linear_init(generator, 1, num_harmonics)  # the source module's Linear(H, 1)
        uv_noise = torch.rand(1, FULL_NOISE_SAMPLES, 1, generator=generator)  # [1, N_full, 1]
        sine_noise = sine_noise[:, :num_samples]
    return HiftNoiseBuffers(rand_ini=rand_ini, sine_noise=sine_noise, uv_noise=uv_noise)
