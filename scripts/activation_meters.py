"""Peak bytes of the tensors an operation creates: a live-tensor tracker (CPU) and the allocator peak (CUDA).

Used by scripts/measure_activations.py (which explains the method): :class:`LiveTensorTracker` counts
every storage an op creates until it dies, :class:`CudaPeakMeter` reads ``max_memory_allocated``; both
keep a peak per phase. ``--sanity`` there runs :func:`run_sanity` against a known pattern.
"""

from __future__ import annotations

import sys
import weakref
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map_only  # noqa: E402

__all__ = ["CudaPeakMeter", "LiveTensorTracker", "MeasureError", "make_meter", "run_sanity", "sanity_pattern"]

SDPA = torch.ops.aten.scaled_dot_product_attention.default
MATH_SDPA_SCORE_COPIES = 2  # a non-fused kernel holds scores and softmax(scores) at once


class MeasureError(ValueError):
    """Bad arguments for a measurement (rows, prompt length, hop, device)."""


class LiveTensorTracker(TorchDispatchMode):
    """Peak bytes of the live tensor storages created while the mode is active, overall and per phase.

    Storages that existed before entering (weights, caches, inputs) are the baseline and never count, also
    when an op writes into them or returns a view of them. ``math_peak_bytes`` adds the attention scores a
    non-fused SDPA would hold; ``keep_top`` > 0 keeps the largest live tensors at each phase's peak.
    """

    def __init__(self, device: torch.device | str = "cpu", *, keep_top: int = 0) -> None:
        super().__init__()
        self.device_type = torch.device(device).type
        self.keep_top = keep_top
        self.live: dict[int, int] = {}  # id(storage) -> counted bytes
        self.origin: dict[int, str] = {}  # id(storage) -> "op [shape] dtype" (with keep_top)
        self.current_bytes = 0
        self.phase_peaks: dict[str, int] = {}
        self.phase_math_peaks: dict[str, int] = {}
        self.phase_top: dict[str, list[tuple[int, str]]] = {}
        self.phase("")  # phases partition the time, so the overall peak is the largest phase peak

    @property
    def peak_bytes(self) -> int:
        return max(self.phase_peaks.values())

    @property
    def math_peak_bytes(self) -> int:
        return max(self.phase_math_peaks.values())

    def phase(self, name: str) -> None:
        """Start phase ``name``: its peak starts from the bytes live now."""
        self.phase_name = name
        self.phase_peaks[name] = self.phase_math_peaks[name] = self.current_bytes

    def _bump(self, math_extra: int = 0) -> None:
        name, now = self.phase_name, self.current_bytes
        if self.keep_top and now > self.phase_peaks[name]:
            largest = sorted(self.live.items(), key=lambda item: -item[1])[: self.keep_top]
            self.phase_top[name] = [(n, self.origin.get(k, "?")) for k, n in largest]
        self.phase_peaks[name] = max(self.phase_peaks[name], now)
        self.phase_math_peaks[name] = max(self.phase_math_peaks[name], now + math_extra)

    def _free(self, key: int) -> None:
        self.current_bytes -= self.live.pop(key, 0)
        self.origin.pop(key, None)

    def _track(self, tensor: torch.Tensor, input_storages: set[int], op: str) -> None:
        if tensor.device.type != self.device_type:
            return
        storage = tensor.untyped_storage()
        key, nbytes = id(storage), storage.nbytes()
        counted = self.live.get(key)
        if counted is not None:  # seen before: only a resize changes it
            self.current_bytes += nbytes - counted
            self.live[key] = nbytes
        elif key not in input_storages and nbytes > 0:  # new, not an alias of an argument
            self.live[key] = nbytes
            self.current_bytes += nbytes
            if self.keep_top:
                self.origin[key] = f"{op} {list(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"
            weakref.finalize(storage, self._free, key)
        self._bump()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not SDPA:
            with self:  # a composite op: run its decomposition through this mode to see its parts
                result = func.decompose(*args, **kwargs)
            if result is not NotImplemented:
                return result
        else:
            self._bump(_math_scores_bytes(*args[:2]))
        leaves, _ = tree_flatten((args, kwargs))
        input_storages = {id(t.untyped_storage()) for t in leaves if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        op = str(func.overloadpacket) if self.keep_top else ""
        tree_map_only(torch.Tensor, lambda t: self._track(t, input_storages, op), out)
        return out


def _math_scores_bytes(query: torch.Tensor, key: torch.Tensor) -> int:
    """Bytes of the scores a non-fused SDPA holds for query [..., Tq, D] and key [..., Tk, D]."""
    rows = query.numel() // query.shape[-1]  # batch x heads x Tq
    return MATH_SDPA_SCORE_COPIES * rows * key.shape[-2] * query.element_size()


class CudaPeakMeter:
    """The tracker's interface on CUDA: ``max_memory_allocated`` above the allocation at ``__enter__``."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise MeasureError(f"CudaPeakMeter needs a cuda device, got {self.device}")
        self.base, self.phase_name = 0, None
        self.phase_peaks: dict[str, int] = {}
        self.phase_math_peaks: dict[str, int] = {}  # stays empty: the GPU runs the kernel it picks

    def __enter__(self) -> CudaPeakMeter:
        torch.cuda.synchronize(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def phase(self, name: str | None) -> None:
        if self.phase_name is not None:
            torch.cuda.synchronize(self.device)
            self.phase_peaks[self.phase_name] = torch.cuda.max_memory_allocated(self.device) - self.base
            torch.cuda.reset_peak_memory_stats(self.device)
        self.phase_name = name

    def __exit__(self, *exc: object) -> None:
        self.phase(None)


def make_meter(device: torch.device, keep_top: int = 0) -> LiveTensorTracker | CudaPeakMeter:
    return CudaPeakMeter(device) if device.type == "cuda" else LiveTensorTracker(device, keep_top=keep_top)


def sanity_pattern(tracker: TorchDispatchMode, n: int = 256) -> tuple[int, int]:
    """Run a known pattern under ``tracker``; returns its (peak, end) bytes: two products (2 S, S = one
    [n, n] fp32), a view (+0), a copy into a baseline buffer (+0), a cat (+2 S: peak 4 S), an in-place op."""
    x, w, buf = torch.randn(n, n), torch.randn(n, n), torch.zeros(2 * n, n)
    size = n * n * 4
    with torch.inference_mode(), tracker:
        y = x @ w
        z = y @ w
        y_t = y.t()
        buf[:n].copy_(z)
        both = torch.cat([y, z])
        del y, y_t, both
        z = z.relu_()
        del z
    return 4 * size, 0


def run_sanity() -> bool:
    ours = LiveTensorTracker()
    expected, end = sanity_pattern(ours)
    ok = ours.peak_bytes == expected and ours.current_bytes == end
    print(f"sanity pattern: peak {expected} B, end {end} B")
    verdict = "ok" if ok else "WRONG"
    print(f"LiveTensorTracker: peak {ours.peak_bytes} B, end {ours.current_bytes} B -> {verdict}")
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as exc:  # torch built without distributed
        print(f"  MemTracker: not importable ({exc})")
        return ok
    theirs = MemTracker()
    sanity_pattern(theirs)
    peak = sum(snap.get("Total", 0) for snap in theirs.get_tracker_snapshot("peak").values())
    now = sum(snap.get("Total", 0) for snap in theirs.get_tracker_snapshot("current").values())
    print(f"MemTracker: peak {peak} B, end {now} B -> {'ok' if peak == expected else 'differs'}")
    return ok
