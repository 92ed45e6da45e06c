"""DiT velocity estimator of the CosyVoice3 flow, numerically equal to the official `DiT`.

Layout is batch-first and time-major, [B, T, C], everywhere (the official module takes [B, C, T] and
transposes on entry). Everything that is constant over one flow call is prepared once by the caller and
passed to every estimator call:

* ``modulation`` [B or 1, M]: the AdaLN vectors of one Euler step, a row of :meth:`DiT.time_modulation`.
  They depend on t only, so a solver can compute (and cache) them for the whole schedule at once.
* ``rope``: the (cos, sin) tables from :meth:`DiT.rotary`.
* ``attn_mask``: from :func:`attention_mask` (bool, True = attend) or its additive float form;
  None means full attention over rows without padding.

Official quirks reproduced here (see docs/cosyvoice.md §5 and §10):

* Rotary embedding of width ``dim_head`` is applied to q and k *before* the head split, on the
  ``heads * dim_head`` wide tensor, so only head 0 is rotated; pairs are interleaved (2i, 2i+1).
* Block AdaLN chunks are (shift, scale, gate) x 2; the final AdaLN chunks are (scale, shift).
* LayerNorms have eps 1e-6 and no affine; the feed-forward GELU uses the tanh approximation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import DiTConfig

LAYER_NORM_EPS = 1e-6
TIME_SCALE = 1000.0
ROPE_BASE = 10000.0


def chunk_mask(seq_len: int, chunk_size: int, num_left_chunks: int = -1, device=None) -> Tensor:
    """Static chunk mask [T, T] (True = may attend): frame i sees j < (i // c + 1) * c.

    With ``num_left_chunks >= 0`` frame i also needs j >= (i // c - num_left_chunks) * c (the wenet
    semantics; the official code ignores this argument and the release config uses -1, i.e. all).
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    pos = torch.arange(seq_len, device=device)
    chunk = torch.div(pos, chunk_size, rounding_mode="floor")
    mask = pos.unsqueeze(0) < ((chunk + 1) * chunk_size).unsqueeze(1)  # [T, T]
    if num_left_chunks >= 0:
        start = (chunk - num_left_chunks).clamp(min=0) * chunk_size
        mask &= pos.unsqueeze(0) >= start.unsqueeze(1)
    return mask


def attention_mask(
    lengths: Sequence[int],
    streaming: Sequence[bool],
    *,
    chunk_size: int,
    num_left_chunks: int = -1,
    repeat: int = 1,
    seq_len: int | None = None,
    device=None,
) -> Tensor | None:
    """Boolean SDPA mask for right-padded rows, broadcastable to [repeat * B, 1, T, T].

    ``lengths`` are the valid frame counts per row, T is ``seq_len`` (default: max of ``lengths``),
    ``streaming`` the per-row flag choosing the chunk mask (counted from frame 0 of each row) over full
    attention. The mask of the B rows is tiled ``repeat`` times (the CFG batch). Returns None when no row
    needs masking at all.
    """
    if len(lengths) != len(streaming) or not lengths:
        raise ValueError("lengths and streaming must be non-empty and of equal length")
    seq_len = max(lengths) if seq_len is None else seq_len
    if seq_len < max(lengths):
        raise ValueError(f"seq_len {seq_len} is shorter than the longest row ({max(lengths)})")
    use_chunks = chunk_size > 0 and any(streaming)
    padded = min(lengths) != seq_len
    if not use_chunks and not padded:
        return None
    if use_chunks and not padded and all(streaming):
        return chunk_mask(seq_len, chunk_size, num_left_chunks, device)[None, None]  # [1, 1, T, T]
    pos = torch.arange(seq_len, device=device)
    lens = torch.tensor(list(lengths) * repeat, device=device)
    mask = (pos.unsqueeze(0) < lens.unsqueeze(1))[:, None, None, :]  # [rB, 1, 1, T]
    if use_chunks:
        full = torch.tensor([not s for s in streaming] * repeat, device=device)[:, None, None, None]
        mask = mask & (chunk_mask(seq_len, chunk_size, num_left_chunks, device)[None, None] | full)
    else:
        mask = mask.expand(-1, -1, seq_len, -1)  # [rB, 1, T, T]
    # A query row that sees no key would give NaN; the official mask helper opens such rows fully.
    return mask | ~mask.any(dim=-1, keepdim=True)


def rotary_tables(inv_freq: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """fp32 (cos, sin) [T, 2F] for positions 0..T-1, frequencies interleaved as (f0, f0, f1, f1, ...)."""
    pos = torch.arange(seq_len, device=inv_freq.device, dtype=torch.float32)
    freqs = pos.unsqueeze(1) * inv_freq.float().unsqueeze(0)  # [T, F]
    freqs = torch.stack((freqs, freqs), dim=-1).flatten(-2)  # [T, 2F]
    return freqs.cos(), freqs.sin()


def apply_head0_rope_(qkv: Tensor, inner_dim: int, cos: Tensor, sin: Tensor) -> None:
    """Rotate, in place, the first ``cos.shape[-1]`` channels of q and k inside a fused [B, T, 3*inner] tensor."""
    batch, seq_len, _ = qkv.shape
    rot = cos.shape[-1]
    qk = qkv.view(batch, seq_len, 3, inner_dim)[:, :, :2, :rot]  # [B, T, 2, R] (q and k, head-0 channels)
    pairs = qk.float().unflatten(-1, (rot // 2, 2))  # [B, T, 2, R/2, 2]
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)  # [B, T, 2, R]
    # cos/sin [T, R] (every row) or [B, T, R] (per-row positions): broadcast over the q/k axis.
    qk.copy_(pairs.flatten(-2) * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2))


class CausalConvPositionEmbedding(nn.Module):
    """Two left-padded grouped convolutions with Mish; returns the embedding (the caller adds x)."""

    def __init__(self, dim: int, kernel: int, groups: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.conv1 = nn.Conv1d(dim, dim, kernel, groups=groups)
        self.conv2 = nn.Conv1d(dim, dim, kernel, groups=groups)

    def forward(self, h: Tensor) -> Tensor:
        y = h.transpose(1, 2)  # [B, D, T]
        y = F.mish(self.conv1(F.pad(y, (self.kernel - 1, 0))))  # [B, D, T]
        y = F.mish(self.conv2(F.pad(y, (self.kernel - 1, 0))))  # [B, D, T]
        return y.transpose(1, 2)  # [B, T, D]


class Attention(nn.Module):
    """Multi-head self-attention with fused biased q/k/v and the head-0 rotary quirk."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads = heads
        self.dim_head = dim_head
        self.inner_dim = heads * dim_head
        self.qkv = nn.Linear(dim, 3 * self.inner_dim)
        self.out = nn.Linear(self.inner_dim, dim)

    def forward(self, h: Tensor, rope: tuple[Tensor, Tensor], attn_mask: Tensor | None) -> Tensor:
        batch, seq_len, _ = h.shape
        qkv = self.qkv(h)  # [B, T, 3 * H * Dh]
        apply_head0_rope_(qkv, self.inner_dim, *rope)
        qkv = qkv.view(batch, seq_len, 3, self.heads, self.dim_head)  # [B, T, 3, H, Dh]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, T, Dh]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # [B, H, T, Dh]
        o = o.transpose(1, 2).reshape(batch, seq_len, self.inner_dim)  # [B, T, H * Dh]
        return self.out(o)


class DiTBlock(nn.Module):
    """AdaLN-Zero transformer block; its modulation vector comes from :meth:`DiT.time_modulation`."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.dim = cfg.dim
        self.attn = Attention(cfg.dim, cfg.heads, cfg.dim_head)
        self.ff1 = nn.Linear(cfg.dim, cfg.ff_dim)
        self.ff2 = nn.Linear(cfg.ff_dim, cfg.dim)

    def forward(
        self, x: Tensor, mod: Tensor, rope: tuple[Tensor, Tensor], attn_mask: Tensor | None
    ) -> Tensor:
        # mod [Bm, 6D] -> six [Bm, 1, D]: shift/scale/gate for attention, then for the feed-forward.
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = (
            mod.unflatten(-1, (6, self.dim)).unsqueeze(1).unbind(2)
        )
        h = F.layer_norm(x, (self.dim,), eps=LAYER_NORM_EPS) * (1 + scale_a) + shift_a
        x = x + gate_a * self.attn(h, rope, attn_mask)
        h = F.layer_norm(x, (self.dim,), eps=LAYER_NORM_EPS) * (1 + scale_f) + shift_f
        return x + gate_f * self.ff2(F.gelu(self.ff1(h), approximate="tanh"))


class DiT(nn.Module):
    """The flow's velocity estimator v(x, t | mu, cond, spk)."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.time_mlp1 = nn.Linear(cfg.freq_embed_dim, cfg.dim)
        self.time_mlp2 = nn.Linear(cfg.dim, cfg.dim)
        # Every block's AdaLN linear plus the output AdaLN linear, stacked: one GEMM per schedule.
        self.modulation = nn.Linear(cfg.dim, cfg.modulation_dim)
        self.input_proj = nn.Linear(cfg.in_dim, cfg.dim)
        self.conv_pos = CausalConvPositionEmbedding(cfg.dim, cfg.conv_kernel, cfg.conv_groups)
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.proj_out = nn.Linear(cfg.dim, cfg.mel_dim)
        # Rotary inverse frequencies stay fp32 whatever dtype the module is cast to (kept off the buffers).
        exponent = torch.arange(0, cfg.dim_head, 2, dtype=torch.float32) / cfg.dim_head
        self.inv_freq = 1.0 / (ROPE_BASE**exponent)  # [Dh / 2]
        self._inv_freq_by_device: dict[torch.device, Tensor] = {}

    def set_inv_freq(self, inv_freq: Tensor) -> None:
        """Use the checkpoint's (persistent) rotary frequencies."""
        self.inv_freq = inv_freq.detach().to("cpu", torch.float32).clone()
        self._inv_freq_by_device.clear()

    def rotary(self, seq_len: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
        """fp32 (cos, sin) tables [T, Dh] for positions 0..T-1 on ``device``."""
        device = torch.device(device)
        inv_freq = self._inv_freq_by_device.get(device)
        if inv_freq is None:
            inv_freq = self._inv_freq_by_device.setdefault(device, self.inv_freq.to(device))
        return rotary_tables(inv_freq, seq_len)

    def time_modulation(self, t: Tensor) -> Tensor:
        """AdaLN vectors [S, M] for flow times ``t`` [S] in [0, 1] (sinusoid of 1000*t, MLP, SiLU, linear)."""
        half = self.cfg.freq_embed_dim // 2
        step = math.log(10000) / (half - 1)
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -step)  # [F/2]
        arg = TIME_SCALE * t.float().unsqueeze(1) * freqs.unsqueeze(0)  # [S, F/2]
        sinus = torch.cat((arg.sin(), arg.cos()), dim=-1).to(self.time_mlp1.weight.dtype)  # [S, F]
        temb = self.time_mlp2(F.silu(self.time_mlp1(sinus)))  # [S, D]
        return self.modulation(F.silu(temb))  # [S, (6 * depth + 2) * D]

    def forward(
        self,
        x: Tensor,
        mu: Tensor,
        cond: Tensor,
        spk: Tensor,
        modulation: Tensor,
        rope: tuple[Tensor, Tensor],
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """x, mu, cond [B, T, 80]; spk [B, 80]; modulation [B or 1, M] -> velocity [B, T, 80]."""
        batch, seq_len, _ = x.shape
        dim, depth = self.cfg.dim, self.cfg.depth
        spk_t = spk.unsqueeze(1).expand(batch, seq_len, spk.shape[-1])  # [B, T, S]
        h = self.input_proj(torch.cat((x, cond, mu, spk_t), dim=-1))  # [B, T, D]
        h = self.conv_pos(h) + h
        for i, block in enumerate(self.blocks):
            h = block(h, modulation[:, i * 6 * dim : (i + 1) * 6 * dim], rope, attn_mask)
        # Output AdaLN: [Bm, 2D] -> scale, shift, each [Bm, 1, D] (scale first, unlike the blocks).
        scale, shift = modulation[:, depth * 6 * dim :].unflatten(-1, (2, dim)).unsqueeze(1).unbind(2)
        h = F.layer_norm(h, (dim,), eps=LAYER_NORM_EPS) * (1 + scale) + shift
        return self.proj_out(h)
