"""The ASR's part of the process's GPU memory plan.

`gpu.memory_gib` is what the whole process may use; `gpu.asr_memory_gib` of it
belongs to the ASR and the rest to the TTS engine. Both models live in one
process and therefore share one PyTorch caching allocator, so the plan is
enforced in two steps:

1. each process caps itself at the shares of the models it holds
   (tts_engine/gpu_share.py): with the engine in this process, TTS + ASR =
   `memory_gib` (`torch.cuda.set_per_process_memory_fraction(memory_gib / device
   total)`); with the engine in worker processes, the ASR's share alone here, and
   each worker caps itself at the TTS share;
2. the ASR's share is kept by bounding what it can allocate: its weights
   (measured when loaded) plus the activations of its largest batch
   (`asr.max_batch_audio_s` seconds of audio, measured by a warm-up batch of
   that size at start-up). Memory the ASR frees between batches goes back to
   the shared allocator, where the TTS engine can reuse it.

Both measurements are logged and kept (`FunASRBackend.memory`); a plan that
the measurement contradicts gives a warning at start-up. On CPU nothing is
capped or measured.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from gateway.config import GPUConfig
from tts_engine.gpu_share import claim_gpu_share

log = logging.getLogger(__name__)

GIB = 1 << 30


def resolve_device(name: str) -> str:
    """`auto` -> `cuda` when torch sees a GPU, else `cpu`; other names as given."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        log.warning("asr.device is %s but torch sees no GPU; using cpu", name)
        return "cpu"
    return name


def _index(device: str) -> int:
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def apply_process_cap(gpu: GPUConfig | None, device: str) -> float | None:
    """Claims the ASR's share (`gpu.asr_memory_gib`) of this process's CUDA cap; returns the fraction
    now set (with the engine in this process too: `gpu.memory_gib` over the device total)."""
    if gpu is None or not gpu.memory_gib or not device.startswith("cuda"):
        return None
    return claim_gpu_share("asr", device, gib=gpu.asr_memory_gib)


@dataclass
class MemoryUse:
    """CUDA memory one operation allocated: what stayed, and its peak above the start."""

    kept_gib: float = 0.0
    peak_gib: float = 0.0


class CudaMeter:
    """Context manager measuring CUDA allocations on one device (a no-op on CPU)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda") and torch.cuda.is_available()
        self.index = _index(device) if self.cuda else None
        self.use = MemoryUse()
        self._start = 0

    def __enter__(self) -> CudaMeter:
        if self.cuda:
            torch.cuda.synchronize(self.index)
            torch.cuda.reset_peak_memory_stats(self.index)
            self._start = torch.cuda.memory_allocated(self.index)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.index)
            end = torch.cuda.memory_allocated(self.index)
            peak = torch.cuda.max_memory_allocated(self.index)
            self.use = MemoryUse(kept_gib=(end - self._start) / GIB, peak_gib=(peak - self._start) / GIB)


def check_share(gpu: GPUConfig | None, weights: MemoryUse, batch: MemoryUse) -> str | None:
    """A warning when the measured ASR memory exceeds its share of the plan."""
    need = weights.kept_gib + batch.peak_gib
    log.info(
        "ASR GPU memory: weights %.2f GiB, largest batch +%.2f GiB (share %s GiB)",
        weights.kept_gib,
        batch.peak_gib,
        "n/a" if gpu is None else f"{gpu.asr_memory_gib:.2f}",
    )
    if gpu is not None and need > gpu.asr_memory_gib:
        return (
            f"the ASR needs {need:.2f} GiB (weights {weights.kept_gib:.2f} + batch {batch.peak_gib:.2f}), "
            f"more than gpu.asr_memory_gib={gpu.asr_memory_gib}; lower asr.max_batch_audio_s "
            "or raise the share"
        )
    return None
