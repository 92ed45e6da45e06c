"""The engine's memory budget: weights + a KV cache pool + an activation reserve per batch row.

``engine.gpu_memory_gib`` is either an absolute size in GiB (> 1) or a fraction (0 < x <= 1) of the
device's total memory (on the CPU: of the host's RAM; the same math then bounds the KV pool in host
memory). The plan::

    per_row   = kv_bytes_per_slot(max_llm_len) + activation_bytes_per_row
    num_slots = min(max_batch_size, floor((budget - weights) / per_row))

The flow's chunk caches (per-voice prompt prefixes, per-stream chunks: cosyvoice/flow/chunk_cache.py)
get ``flow_cache_bytes``: a fixed size taken off before the slots (``engine.flow_cache_mib``), or, when
it is left to the plan (None), whatever the weights, the slots and their reserve leave of the budget.
Their manager evicts least recently used voice prefixes and lets streams recompute instead of going
past it.

Every admitted request holds one KV slot and may take one batch row, so the engine never admits more
requests than the plan's ``num_slots``; the rest wait in its queue. A budget that cannot hold the
weights and one row stops start-up with a ``MemoryBudgetError`` naming the config key.

The activation reserve is an estimate (``estimate_activation_bytes_per_row``): the largest transient
tensors of one row in a flow hop (DiT over prompt + hop frames, doubled for classifier-free guidance)
and in the vocoder (the hop's samples through the last, widest-in-time stage). On CUDA the process
cap itself is torch's per-process memory fraction (tts_engine/gpu_share.py, ``gpu.memory_gib``);
this plan decides how much of it the engine's pool may claim.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from tts_engine.errors import EngineError

__all__ = [
    "GIB",
    "MemoryBudget",
    "MemoryBudgetError",
    "MemoryPlan",
    "device_total_bytes",
    "estimate_activation_bytes_per_row",
    "module_bytes",
]

GIB = 1 << 30
BUDGET_KEY = "engine.gpu_memory_gib"
PROMPT_SECONDS = 10.0  # typical prompt recording a flow hop attends to
HOP_TOKENS = 103  # the largest streaming hop (100) plus its look-ahead
DIT_LIVE_TENSORS = 16  # [frames, dim] tensors alive at once inside one DiT block (estimate)
VOCODER_LIVE_CHANNELS = 256  # channels x samples alive at once in the vocoder's last stages (estimate)


class MemoryBudgetError(EngineError):
    """The configured budget cannot hold the model and one stream, or the value is not a size."""


def device_total_bytes(device: torch.device | str) -> int:
    """Total memory of ``device``: the GPU's, or the host's RAM for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * GIB  # a platform without sysconf: assume a modest host


def module_bytes(*modules: nn.Module) -> int:
    """Bytes of the parameters and buffers of ``modules`` (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            key = tensor.data_ptr()
            if key in seen:
                continue
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """How a budget is spent; all sizes in bytes."""

    budget_bytes: int
    weights_bytes: int
    kv_bytes_per_slot: int
    activation_bytes_per_row: int
    num_slots: int
    flow_cache_bytes: int = 0

    @property
    def flow_cache_mib(self) -> float:
        return self.flow_cache_bytes / (1 << 20)

    @property
    def kv_pool_bytes(self) -> int:
        return self.num_slots * self.kv_bytes_per_slot

    @property
    def reserve_bytes(self) -> int:
        return self.num_slots * self.activation_bytes_per_row

    @property
    def planned_bytes(self) -> int:
        return self.weights_bytes + self.kv_pool_bytes + self.reserve_bytes + self.flow_cache_bytes

    def as_stats(self) -> dict[str, int]:
        stats = asdict(self)
        stats.update(
            kv_pool_bytes=self.kv_pool_bytes,
            reserve_bytes=self.reserve_bytes,
            planned_bytes=self.planned_bytes,
        )
        return {f"memory_{k}" if not k.startswith("num_") else k: v for k, v in stats.items()}


class MemoryBudget:
    """A byte budget for one engine; ``plan()`` sizes the KV pool from it."""

    def __init__(self, total_bytes: int) -> None:
        if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes <= 0:
            raise MemoryBudgetError(
                f"{BUDGET_KEY}: the budget must be a positive byte count, got {total_bytes!r}"
            )
        self.total_bytes = total_bytes

    @classmethod
    def from_gib(cls, gpu_memory_gib: float, device: torch.device | str) -> MemoryBudget:
        """Absolute GiB when > 1, else a fraction of ``device``'s total memory."""
        if isinstance(gpu_memory_gib, bool) or not isinstance(gpu_memory_gib, int | float):
            raise MemoryBudgetError(f"{BUDGET_KEY} must be a number, got {gpu_memory_gib!r}")
        if not math.isfinite(gpu_memory_gib) or gpu_memory_gib <= 0:
            raise MemoryBudgetError(
                f"{BUDGET_KEY} must be > 0 (GiB, or a fraction <= 1), got {gpu_memory_gib}"
            )
        if gpu_memory_gib <= 1:
            return cls(int(gpu_memory_gib * device_total_bytes(device)))
        return cls(int(gpu_memory_gib * GIB))

    def plan(
        self,
        *,
        weights_bytes: int,
        kv_bytes_per_slot: int,
        activation_bytes_per_row: int,
        max_batch_size: int,
        flow_cache_bytes: int | None = 0,
    ) -> MemoryPlan:
        """Fit as many KV slots as the budget holds after the weights, at most ``max_batch_size``.

        ``flow_cache_bytes``: a fixed flow cache size taken off first, or None for what the slots leave.
        """
        per_row = kv_bytes_per_slot + activation_bytes_per_row
        if per_row <= 0 or max_batch_size < 1:
            raise ValueError(
                "kv_bytes_per_slot + activation_bytes_per_row and max_batch_size must be positive"
            )
        fixed_cache = 0 if flow_cache_bytes is None else max(0, int(flow_cache_bytes))
        free = self.total_bytes - weights_bytes - fixed_cache
        num_slots = min(max_batch_size, free // per_row) if free > 0 else 0
        if num_slots < 1:
            raise MemoryBudgetError(
                f"{BUDGET_KEY}: a budget of {self.total_bytes / GIB:.2f} GiB cannot hold the weights "
                f"({weights_bytes / GIB:.2f} GiB) plus one stream ({per_row / GIB:.3f} GiB of KV cache and "
                "activations)"
                + (f" and the flow cache ({fixed_cache / GIB:.2f} GiB)" if fixed_cache else "")
                + "; raise it or lower engine.max_llm_len"
                + (" or engine.flow_cache_mib" if fixed_cache else "")
            )
        cache = fixed_cache if flow_cache_bytes is not None else free - num_slots * per_row
        return MemoryPlan(
            self.total_bytes, weights_bytes, kv_bytes_per_slot, activation_bytes_per_row, num_slots, cache
        )


def estimate_activation_bytes_per_row(model: Any, element_size: int = 4) -> int:
    """Transient bytes of one batch row in the biggest flow hop and vocoder call (an estimate)."""
    config = model.config
    dit = config.flow.dit
    frames = int(PROMPT_SECONDS * config.token_frame_rate + HOP_TOKENS) * config.token_mel_ratio
    attention = dit.heads * frames * frames  # one head-stack of attention scores
    flow = 2 * (DIT_LIVE_TENSORS * frames * dit.dim + attention)  # x2: classifier-free guidance rows
    samples = HOP_TOKENS * config.sample_rate // config.token_frame_rate
    vocoder = VOCODER_LIVE_CHANNELS * samples
    return (max(flow, vocoder) + config.llm.hidden_size * 4 * 1024) * element_size  # + an LLM prefill
