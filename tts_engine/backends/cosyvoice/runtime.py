"""What a CosyVoice backend runs on: device and dtype, the memory plan, the LLM runner, the flow cache.

The memory plan (tts_engine/memory.py) turns a budget into KV slots: the weights (plus, with CUDA graphs,
the static decode step's scratch KV slot) are fixed, each slot costs its KV cache and an activation
reserve, the flow cache takes ``flow_cache_mib`` or what is left. The runner is the native
:class:`~cosyvoice.llm.LLMRunner`, its CUDA-graph form (``GraphDecodeRunner``, every bucket captured at
start-up) or the optional vLLM one (``llm_vllm``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from cosyvoice.flow.chunk_cache import FlowCacheManager
from cosyvoice.llm import LLMRunner
from cosyvoice.llm.graph_decode import GraphDecodeRunner
from cosyvoice.model import CosyVoice3
from tts_engine.memory import MemoryBudget, MemoryPlan, estimate_activation_bytes_per_row

__all__ = [
    "kv_cache_bytes", "load_model", "make_flow_cache", "make_runner", "plan_memory", "resolve_device",
    "resolve_dtype",
]  # fmt: skip

log = logging.getLogger(__name__)

DEFAULT_FLOW_CACHE_MIB = 2048  # flow cache without a memory budget
MIB = 1 << 20

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}  # fmt: skip


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``"auto"``: CUDA when torch sees a GPU, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"auto"`` is float32 everywhere: the reduced-precision numerics are not checked against upstream."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be auto, {', '.join(_DTYPES)} or a torch.dtype, got {dtype!r}")
    return _DTYPES[dtype]


def load_model(
    model_dir: str | Path | None,
    *,
    device: str | torch.device | None,
    dtype: str | torch.dtype,
    use_rl_llm: bool,
    max_seconds: float | None,
) -> CosyVoice3:
    """The model of ``model_dir`` on the device and in the dtype asked for (``auto`` resolved)."""
    if model_dir is None:
        raise ValueError("give model_dir (or an already loaded model)")
    return CosyVoice3.from_pretrained(
        model_dir,
        device=resolve_device(device),
        dtype=resolve_dtype(dtype),
        use_rl_llm=use_rl_llm,
        max_seconds=max_seconds,
    )


def kv_cache_bytes(model: CosyVoice3, *, max_batch: int, max_len: int) -> int:
    """Bytes of the LLM KV cache for ``max_batch`` slots of ``max_len`` positions (the memory seam)."""
    cfg = model.llm.config
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim  # keys + values
    element = model.llm.speech_embedding.weight.element_size()
    return max_batch * (max_len + 1) * per_position * element


def plan_memory(
    model: CosyVoice3,
    budget: MemoryBudget,
    *,
    weights_bytes: int,
    cuda_graphs: bool,
    max_llm_len: int,
    max_batch_size: int,
    flow_cache: bool,
    flow_cache_mib: float | None,
) -> MemoryPlan:
    """The budget as KV slots (at most ``max_batch_size``) and the flow cache's bytes."""
    slot = kv_cache_bytes(model, max_batch=1, max_len=max_llm_len)
    fixed_bytes = weights_bytes + (slot if cuda_graphs else 0)  # the static decode step's scratch slot
    plan = budget.plan(
        weights_bytes=fixed_bytes,
        kv_bytes_per_slot=slot,
        activation_bytes_per_row=estimate_activation_bytes_per_row(
            model, model.llm.speech_embedding.weight.element_size()
        ),
        max_batch_size=max_batch_size,
        flow_cache_bytes=(
            0 if not flow_cache else None if flow_cache_mib is None else int(flow_cache_mib * MIB)
        ),
    )
    log.info("cosyvoice memory plan: %s", plan)
    return plan


def make_runner(
    model: CosyVoice3, *, llm_backend: str, cuda_graphs: bool, use_rl_llm: bool, max_batch: int, max_len: int
) -> Any:
    """The LLM runner: vLLM's (optional extra, imported only when chosen), CUDA graphs', or the native one."""
    if llm_backend == "vllm":  # pip install .[vllm]
        from tts_engine.backends.cosyvoice.llm_vllm import VLLMRunner

        return VLLMRunner.from_model_dir(
            model.llm,
            model.config.files.model_dir,
            use_rl_llm=use_rl_llm,
            max_batch=max_batch,
            max_len=max_len,
            dtype=str(model.llm.speech_embedding.weight.dtype).removeprefix("torch."),
        )
    if cuda_graphs:
        runner = GraphDecodeRunner(model.llm, max_batch=max_batch, max_len=max_len, use_cuda_graphs=True)
        runner.warmup()  # every (batch, kv length) bucket captured now, not on a live step
        log.info("cosyvoice decode step: %d CUDA graphs captured", runner.num_graphs)
        return runner
    return LLMRunner(model.llm, max_batch=max_batch, max_len=max_len)


def make_flow_cache(plan: MemoryPlan | None, flow_cache_mib: float | None) -> FlowCacheManager:
    """The flow cache with the plan's bytes, else ``flow_cache_mib`` (default 2 GiB without a budget)."""
    if plan is not None:
        limit = plan.flow_cache_bytes
    else:
        limit = int((DEFAULT_FLOW_CACHE_MIB if flow_cache_mib is None else flow_cache_mib) * MIB)
    log.info("cosyvoice flow cache: %.0f MiB", limit / MIB)
    return FlowCacheManager(limit)
