"""Qwen2 decoder stack driven by input embeddings, with a slot-based batched KV cache.

Module and parameter names follow Hugging Face's ``Qwen2Model`` (``embed_tokens``,
``layers.N.self_attn.q_proj`` ...), so a state dict exported from here loads into a stock
``Qwen2ForCausalLM`` and vice versa. The text ``lm_head`` is deliberately absent.

The cache holds ``max_batch`` slots. Each call to :meth:`Qwen2Model.forward` appends a
right-padded chunk of new positions to a set of slots (prefill: many positions per row,
decode: one), so rows of different lengths run together and slots can be handed out and
freed between calls.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class KVCacheError(RuntimeError):
    """A cache slot was misused: none free, not allocated, or out of positions."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Qwen2Config:
    """Backbone geometry; the field names are Hugging Face's ``config.json`` keys (read and written so)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Qwen2Config.{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_key_value_heads <= 0 or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, raw: dict) -> Qwen2Config:
        """Build from a Hugging Face ``config.json`` mapping (unknown keys are ignored)."""
        fields = dataclasses.fields(cls)
        required = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in raw]
        if required:
            raise ValueError(f"Qwen2 config lacks required keys: {required}")
        names = [f.name for f in fields]
        return cls(**{n: raw[n] for n in names if n in raw})

    @classmethod
    def from_json(cls, path: str | Path) -> Qwen2Config:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> dict[str, int | float]:
        """The Hugging Face ``config.json`` entries of this geometry (the inverse of :meth:`from_dict`)."""
        return dataclasses.asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # statistics in fp32 whatever the working dtype, then scale in the working dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-split ("rotate_half") RoPE tables for integer ``positions`` [B, T] -> two [B, T, head_dim]."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)  # [head_dim/2]
    freqs = positions.float()[..., None] * inv_freq  # [B, T, head_dim/2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [B, T, head_dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, head_dim]; cos/sin [B, T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [B, heads, T, head_dim]
    return x * cos[:, None] + rotated * sin[:, None]


class KVCache:
    """Key/value buffers ``[max_batch + reserved_slots, n_kv_heads, max_len + 1, head_dim]`` per layer.

    Position ``max_len`` of every slot is a scratch cell that absorbs the writes of padding
    positions; it is never attended to. Slot bookkeeping (free list, filled length) lives on
    the host so a step needs no device synchronisation to plan its masks.

    Only slots ``0 .. max_batch - 1`` are ever handed out. The ``reserved_slots`` rows after
    them (indices ``max_batch ..``) belong to the cache's owner, e.g. as a scratch slot that
    absorbs the writes of padding rows in a fixed-size batch.
    """

    def __init__(
        self,
        config: Qwen2Config,
        *,
        max_batch: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        reserved_slots: int = 0,
    ) -> None:
        if max_batch <= 0 or max_len <= 0:
            raise ValueError(f"max_batch and max_len must be positive, got {max_batch}, {max_len}")
        if reserved_slots < 0:
            raise ValueError(f"reserved_slots must be non-negative, got {reserved_slots}")
        shape = (max_batch + reserved_slots, config.num_key_value_heads, max_len + 1, config.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.values = [
            torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)
        ]
        self.max_batch = max_batch
        self.max_len = max_len
        self.reserved_slots = reserved_slots
        self._lengths = [0] * max_batch
        self._allocated = [False] * max_batch

    @property
    def num_free_slots(self) -> int:
        return self._allocated.count(False)

    def allocate(self) -> int:
        """Reserve the lowest free slot (empty) and return its index."""
        for slot, used in enumerate(self._allocated):
            if not used:
                self._allocated[slot] = True
                self._lengths[slot] = 0
                return slot
        raise KVCacheError(f"all {self.max_batch} KV cache slots are in use")

    def free(self, slot: int) -> None:
        self._check_slot(slot)
        self._allocated[slot] = False
        self._lengths[slot] = 0

    def length(self, slot: int) -> int:
        """Number of positions already stored in ``slot``."""
        self._check_slot(slot)
        return self._lengths[slot]

    def advance(self, slot: int, num_positions: int = 1) -> None:
        """Record that ``num_positions`` more positions of ``slot`` were written (by a planned forward)."""
        start = self.length(slot)
        if num_positions < 0 or start + num_positions > self.max_len:
            raise KVCacheError(
                f"slot {slot} would hold {start + num_positions} positions, max_len {self.max_len}"
            )
        self._lengths[slot] = start + num_positions

    def _set_length(self, slot: int, length: int) -> None:
        self._lengths[slot] = length

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_batch or not self._allocated[slot]:
            raise KVCacheError(f"KV cache slot {slot} is not allocated")


@dataclasses.dataclass(frozen=True, slots=True)
class _StepPlan:
    """Device-side indices shared by all layers of one forward call."""

    slots: torch.Tensor  # [B] int64
    write_pos: torch.Tensor  # [B, T] int64, padding positions point at the scratch cell
    mask: torch.Tensor  # [B, 1, T, K] bool, True = may attend
    kv_len: int  # K, number of cache positions read


class Qwen2Attention(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        plan: _StepPlan,
    ) -> torch.Tensor:
        b, t, _ = x.shape  # [B, T, H]
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, nkv, T, hd]
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)  # [B, T, nkv, hd]
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        # advanced indices on dims 0 and 2 -> the indexed view is [B, T, nkv, hd]
        cache_k[plan.slots[:, None], :, plan.write_pos] = k.transpose(1, 2).to(cache_k.dtype)
        cache_v[plan.slots[:, None], :, plan.write_pos] = v.to(cache_v.dtype)
        keys = cache_k[plan.slots, :, : plan.kv_len]  # [B, nkv, K, hd]
        values = cache_v[plan.slots, :, : plan.kv_len]  # [B, nkv, K, hd]
        # Grouped-query attention in the grouped layout: query head h reads kv head h // groups, so the
        # groups query heads of one kv head go side by side on the query axis, [B, nkv, groups * T, hd],
        # and every kv head is read once as it is (no copy of the keys and values per query head).
        groups = self.num_heads // self.num_kv_heads
        q = q.reshape(b, self.num_kv_heads, groups * t, self.head_dim)  # rows (g, t) of each kv head
        mask = plan.mask  # [B, 1, T, K]; one query position (decode) broadcasts over the groups
        if groups > 1 and t > 1:
            mask = mask.repeat(1, 1, groups, 1)  # [B, 1, groups * T, K], row g * T + t is position t's
        out = F.scaled_dot_product_attention(
            q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=1.0 / math.sqrt(self.head_dim)
        )  # [B, nkv, groups * T, hd]
        out = out.view(b, self.num_heads, t, self.head_dim)  # [B, nh, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))  # [B, T, H]


class Qwen2MLP(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.self_attn = Qwen2Attention(config)
        self.mlp = Qwen2MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, cache_k, cache_v, plan: _StepPlan) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache_k, cache_v, plan)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    """The decoder without a text head; ``forward`` returns states after the final RMSNorm."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def new_cache(self, *, max_batch: int, max_len: int, reserved_slots: int = 0) -> KVCache:
        weight = self.embed_tokens.weight
        return KVCache(
            self.config,
            max_batch=max_batch,
            max_len=max_len,
            device=weight.device,
            dtype=weight.dtype,
            reserved_slots=reserved_slots,
        )

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        cache: KVCache,
        slots: Sequence[int],
        lengths: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Append ``inputs_embeds`` [B, T, H] (row b valid for its first ``lengths[b]`` positions)
        to cache ``slots`` and return the final hidden states [B, T, H]; padded positions hold
        garbage. Positions continue from each slot's stored length (0 right after ``allocate``)."""
        b, t, h = inputs_embeds.shape
        if h != self.config.hidden_size:
            raise ValueError(f"inputs_embeds hidden size {h} != {self.config.hidden_size}")
        lengths = [t] * b if lengths is None else list(lengths)
        slots = list(slots)
        if len(slots) != b or len(lengths) != b:
            raise ValueError(f"need one slot and one length per row: {b} rows, {len(slots)} slots")
        if len(set(slots)) != b:
            raise KVCacheError(f"duplicate slots in one call: {slots}")
        starts = [cache.length(s) for s in slots]
        for slot, start, n in zip(slots, starts, lengths, strict=True):
            if not 1 <= n <= t:
                raise ValueError(f"row length {n} outside 1..{t}")
            if start + n > cache.max_len:
                raise KVCacheError(f"slot {slot} would hold {start + n} positions, max_len {cache.max_len}")
        plan, positions = self._plan(inputs_embeds.device, t, slots, starts, lengths, cache.max_len)
        hidden = self.forward_planned(inputs_embeds, cache, plan, positions)
        for slot, start, n in zip(slots, starts, lengths, strict=True):
            cache._set_length(slot, start + n)
        return hidden

    def forward_planned(
        self, inputs_embeds: torch.Tensor, cache: KVCache, plan: _StepPlan, positions: torch.Tensor
    ) -> torch.Tensor:
        """The device part of :meth:`forward`: run ``inputs_embeds`` [B, T, H] at RoPE ``positions``
        [B, T] through the layers with a ready ``plan`` and return the final states [B, T, H].

        No checks, no host reads and no slot bookkeeping: the caller has validated the plan
        and records the new lengths itself (:meth:`KVCache.advance`)."""
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, inputs_embeds.dtype)
        x = inputs_embeds
        for layer, cache_k, cache_v in zip(self.layers, cache.keys, cache.values, strict=True):
            x = layer(x, cos, sin, cache_k, cache_v, plan)
        return self.norm(x)

    @staticmethod
    def _plan(
        device: torch.device,
        t: int,
        slots: list[int],
        starts: list[int],
        lengths: list[int],
        max_len: int,
    ) -> tuple[_StepPlan, torch.Tensor]:
        kv_len = max(s + n for s, n in zip(starts, lengths, strict=True))
        start = torch.tensor(starts, device=device, dtype=torch.int64)  # [B]
        end = start + torch.tensor(lengths, device=device, dtype=torch.int64)  # [B]
        offsets = torch.arange(t, device=device, dtype=torch.int64)  # [T]
        positions = start[:, None] + offsets  # [B, T]
        write_pos = torch.where(positions < end[:, None], positions, torch.full_like(positions, max_len))
        key_pos = torch.arange(kv_len, device=device, dtype=torch.int64)  # [K]
        mask = (key_pos <= positions[:, :, None]) & (key_pos < end[:, None, None])  # [B, T, K]
        slot_index = torch.tensor(slots, device=device, dtype=torch.int64)  # [B]
        return _StepPlan(slot_index, write_pos, mask[:, None], kv_len), positions


def decode_plan(slots: torch.Tensor, positions: torch.Tensor, kv_len: int) -> tuple[_StepPlan, torch.Tensor]:
    """A one-position-per-row plan built on the device from device tensors only (no host sync).

    ``slots`` [B] and ``positions`` [B] (int64) give each row's cache slot and the position its
    new token is written to (= the slot's length before the step); every position must lie below
    ``kv_len``. Each row attends to positions ``0 .. position`` of its own slot. Returns the plan
    and the RoPE positions [B, 1]. The shapes depend only on B and ``kv_len``.
    """
    rope_positions = positions[:, None]  # [B, 1]
    key_pos = torch.arange(kv_len, device=positions.device, dtype=torch.int64)  # [K]
    mask = key_pos <= rope_positions[:, :, None]  # [B, 1, K]
    return _StepPlan(slots, rope_positions, mask[:, None], kv_len), rope_positions
