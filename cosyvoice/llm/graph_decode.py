"""A static-shape decode step for the speech LM, ready for CUDA graphs and ``torch.compile``.

:class:`GraphDecodeRunner` is a drop-in :class:`~cosyvoice.llm.LLMRunner` whose ``decode_step``
runs one fixed-shape function per (batch bucket, kv bucket) pair:

- the batch is padded up to a batch bucket (powers of two up to ``max_batch``); padding rows
  write into a scratch cache slot (index ``max_batch``) that no request is ever given and that
  real rows never read (each row reads only its own slot);
- attention reads the first ``kv_len`` cache positions, ``kv_len`` being the smallest kv bucket
  (powers of two from 256, capped at ``max_len``) that holds every row's new position;
- the host writes (token, slot, position) per row into a small int64 tensor, copies it to a
  static device buffer (one non-blocking H2D copy per step), and everything from that buffer
  to the static log-prob buffer [batch, 6761] - embedding, mask/RoPE/write plan, layers, head -
  is computed on the device with no host sync and no data-dependent Python control flow.

On CUDA with ``use_cuda_graphs=True`` each pair is captured once with ``torch.cuda.CUDAGraph``
(warm-up on a side stream, one shared memory pool) and replayed; otherwise the same function
runs eagerly, optionally wrapped in ``torch.compile(fullgraph=True, dynamic=False)``.
``prefill``, ``abort`` and sampling are inherited unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

import torch

from cosyvoice.llm.lm import CosyVoice3LM
from cosyvoice.llm.qwen2 import KVCacheError, decode_plan
from cosyvoice.llm.runner import LLMRequest, LLMRunner, StepOutput, check_running_requests

__all__ = ["MIN_KV_BUCKET", "GraphDecodeConfigError", "GraphDecodeRunner", "power_of_two_buckets"]

MIN_KV_BUCKET = 256  # smallest default kv bucket
# torch.compile modes that capture CUDA graphs themselves (cannot be nested in our capture)
CUDAGRAPH_COMPILE_MODES = frozenset({"reduce-overhead", "max-autotune"})
GRAPH_WARMUP_ITERS = 3  # eager runs on a side stream before a capture, as the PyTorch docs prescribe
INPUT_COLUMNS = 3  # static input row: (token, slot, position)


class GraphDecodeConfigError(ValueError):
    """A GraphDecodeRunner setting (buckets, graphs, compile options, warm-up sizes) that cannot work."""


def power_of_two_buckets(low: int, high: int) -> tuple[int, ...]:
    """Powers of two from ``low`` (itself a power of two) that are below ``high``, then ``high``.

    ``power_of_two_buckets(1, 6) == (1, 2, 4, 6)``; ``power_of_two_buckets(256, 100) == (100,)``.
    """
    if low < 1 or low & (low - 1) or high < 1:
        raise GraphDecodeConfigError(f"need a power-of-two low >= 1 and high >= 1, got {low}, {high}")
    buckets, size = [], low
    while size < high:
        buckets.append(size)
        size *= 2
    return (*buckets, high)


def _check_buckets(
    buckets: Sequence[int] | None, default: tuple[int, ...], limit: int, name: str
) -> tuple[int, ...]:
    """Validated buckets: strictly increasing ints in 1..limit, the last one equal to ``limit``."""
    if buckets is None:
        return default
    if isinstance(buckets, str | bytes) or not isinstance(buckets, Iterable):
        raise GraphDecodeConfigError(f"{name} must be a sequence of sizes, got {buckets!r}")
    values = tuple(buckets)
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise GraphDecodeConfigError(f"{name} must be a non-empty sequence of ints, got {values!r}")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)) or values[0] < 1:
        raise GraphDecodeConfigError(f"{name} must be strictly increasing and positive, got {values}")
    if values[-1] != limit:
        raise GraphDecodeConfigError(f"the largest of {name} must be exactly {limit}, got {values}")
    return values


def _bucket_for(buckets: tuple[int, ...], size: int) -> int:
    return next(b for b in buckets if b >= size)  # callers check size <= buckets[-1]


def _compile(fn: Callable, mode: str | None, backend: str | Callable) -> Callable:
    """``torch.compile`` for one static graph per shape; a bad mode/backend raises a config error."""
    if mode is not None and backend != "inductor":
        raise GraphDecodeConfigError(f"compile_mode {mode!r} applies to the inductor backend only")
    try:
        return torch.compile(fn, fullgraph=True, dynamic=False, mode=mode, backend=backend)
    except RuntimeError as exc:  # unknown mode or backend name
        raise GraphDecodeConfigError(f"cannot compile the decode step: {exc}") from exc


class _CudaGraphCapturer:
    """Captures step functions as CUDA graphs that share one memory pool."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise GraphDecodeConfigError(f"use_cuda_graphs needs a model on a CUDA device, it is on {device}")
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        """Warm ``step`` up on a side stream, capture it, and return the graph's replay."""
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(GRAPH_WARMUP_ITERS):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                step()
        return graph.replay


class GraphDecodeRunner(LLMRunner):
    """:class:`~cosyvoice.llm.LLMRunner` with a static-shape, graph-capturable ``decode_step``.

    Args:
        model, max_batch, max_len: as for ``LLMRunner``; ``max_batch`` slots are handed out, the
            cache holds one more (the scratch slot of padding rows).
        batch_buckets: padded batch sizes, strictly increasing, the last equal to ``max_batch``;
            default ``power_of_two_buckets(1, max_batch)``.
        kv_buckets: attended cache lengths, strictly increasing, the last equal to ``max_len``;
            default ``power_of_two_buckets(MIN_KV_BUCKET, max_len)``.
        use_cuda_graphs: capture each (batch, kv) pair as a CUDA graph on first use and replay
            it; the model must be on a CUDA device.
        compile_step: wrap the static step in ``torch.compile(fullgraph=True, dynamic=False,
            mode=compile_mode, backend=compile_backend)``; with ``use_cuda_graphs`` the compiled
            function is what gets captured (so modes that make their own graphs are refused).
    """

    reserved_slots = 1

    def __init__(
        self,
        model: CosyVoice3LM,
        *,
        max_batch: int,
        max_len: int,
        batch_buckets: Sequence[int] | None = None,
        kv_buckets: Sequence[int] | None = None,
        use_cuda_graphs: bool = False,
        compile_step: bool = False,
        compile_mode: str | None = None,
        compile_backend: str | Callable = "inductor",
    ) -> None:
        if max_batch <= 0 or max_len <= 0:
            raise GraphDecodeConfigError(
                f"max_batch and max_len must be positive, got {max_batch}, {max_len}"
            )
        self.batch_buckets = _check_buckets(
            batch_buckets, power_of_two_buckets(1, max_batch), max_batch, "batch_buckets"
        )
        self.kv_buckets = _check_buckets(
            kv_buckets, power_of_two_buckets(MIN_KV_BUCKET, max_len), max_len, "kv_buckets"
        )
        if use_cuda_graphs and compile_step and compile_mode in CUDAGRAPH_COMPILE_MODES:
            raise GraphDecodeConfigError(
                f"compile_mode {compile_mode!r} captures its own CUDA graphs; use it with use_cuda_graphs=False"
            )
        if not compile_step and (compile_mode is not None or compile_backend != "inductor"):
            raise GraphDecodeConfigError("compile_mode / compile_backend need compile_step=True")
        self._step_fn: Callable[[torch.Tensor, torch.Tensor, int], None] = self._static_step
        if compile_step:
            self._step_fn = _compile(self._static_step, compile_mode, compile_backend)
        self._compiled = compile_step
        device = model.speech_embedding.weight.device
        self._capturer = _CudaGraphCapturer(device) if use_cuda_graphs else None
        super().__init__(model, max_batch=max_batch, max_len=max_len)
        self._scratch_slot = max_batch  # the cache's reserved row
        vocab = model.llm_decoder.out_features
        pin = device.type == "cuda"
        self._inputs = {
            b: torch.zeros(b, INPUT_COLUMNS, dtype=torch.int64, device=device) for b in self.batch_buckets
        }
        self._host_inputs = {
            b: torch.zeros(b, INPUT_COLUMNS, dtype=torch.int64, pin_memory=pin) for b in self.batch_buckets
        }
        self._outputs = {
            b: torch.zeros(b, vocab, dtype=torch.float32, device=device) for b in self.batch_buckets
        }
        self._graphs: dict[tuple[int, int], Callable[[], None]] = {}
        self._prepared: set[tuple[int, int]] = set()

    @property
    def num_graphs(self) -> int:
        """CUDA graphs captured so far (always 0 without ``use_cuda_graphs``)."""
        return len(self._graphs)

    @property
    def prepared_shapes(self) -> frozenset[tuple[int, int]]:
        """(batch bucket, kv bucket) pairs already captured / compiled / run by warm-up or a step."""
        return frozenset(self._prepared)

    @torch.inference_mode()
    def warmup(
        self, batch_sizes: Iterable[int] | None = None, kv_lengths: Iterable[int] | None = None
    ) -> None:
        """Capture (CUDA graphs) or compile and run once every (batch, kv) bucket pair that covers
        ``batch_sizes`` x ``kv_lengths`` (default: all buckets). Only the scratch slot is written,
        so this may run between steps while requests are active."""
        batches = self._buckets_covering(self.batch_buckets, batch_sizes, "batch size")
        kv_lens = self._buckets_covering(self.kv_buckets, kv_lengths, "kv length")
        for batch in batches:
            for kv_len in kv_lens:
                self._prepare(batch, kv_len, run_once=True)

    @torch.inference_mode()
    def decode_step(self, requests: Sequence[LLMRequest]) -> list[StepOutput]:
        if not requests:
            return []
        check_running_requests(requests)
        slots = [r.slot for r in requests]
        if len(set(slots)) != len(slots):
            raise KVCacheError(f"duplicate slots in one call: {slots}")
        starts = [self.cache.length(s) for s in slots]  # each new token is written at its slot's length
        if max(starts) >= self.cache.max_len:
            raise KVCacheError(f"a slot of {slots} already holds max_len {self.cache.max_len} positions")
        num_rows = len(requests)
        batch = _bucket_for(self.batch_buckets, num_rows)
        kv_len = _bucket_for(self.kv_buckets, max(starts) + 1)
        self._prepare(batch, kv_len, run_once=False)  # before the inputs: a capture runs on padding rows
        rows = [[r.out_tokens[-1], r.slot, start] for r, start in zip(requests, starts, strict=True)]
        rows += [self._padding_row()] * (batch - num_rows)
        host = self._host_inputs[batch]
        host.copy_(torch.tensor(rows, dtype=torch.int64))
        self._inputs[batch].copy_(host, non_blocking=True)  # the step's one host->device copy
        self._run(batch, kv_len)
        logp = self._outputs[batch][:num_rows].to("cpu", copy=True)  # [B, V], the one device->host copy
        for slot in slots:
            self.cache.advance(slot)
        return self._advance_all(requests, logp)

    # -- the static step ------------------------------------------------------------------------

    def _static_step(self, inputs: torch.Tensor, out: torch.Tensor, kv_len: int) -> None:
        """inputs [B, 3] int64 (token, slot, position) -> out [B, V] fp32 log-probs; writes each
        row's key/value at (slot, position). Shapes depend only on B and ``kv_len``."""
        tokens, slots, positions = inputs.unbind(1)  # each [B]
        embeds = self.model.speech_embedding(tokens)[:, None]  # [B, 1, H]
        plan, rope_positions = decode_plan(slots, positions, kv_len)
        hidden = self.model.model.forward_planned(embeds, self.cache, plan, rope_positions)  # [B, 1, H]
        out.copy_(self.model.speech_logp(hidden[:, 0]))  # [B, V]

    def _call_step(self, batch: int, kv_len: int) -> None:
        if not self._compiled:
            self._static_step(self._inputs[batch], self._outputs[batch], kv_len)
            return
        import torch._dynamo.config  # loaded by torch.compile already; kept out of module import (~2 s)

        # one dynamo cache entry per static shape; the default limit (8) is below a typical bucket grid
        limit = max(torch._dynamo.config.recompile_limit, 2 * len(self.batch_buckets) * len(self.kv_buckets))
        with torch._dynamo.config.patch(recompile_limit=limit):
            self._step_fn(self._inputs[batch], self._outputs[batch], kv_len)

    def _run(self, batch: int, kv_len: int) -> None:
        replay = self._graphs.get((batch, kv_len))
        if replay is not None:
            replay()
        else:
            self._call_step(batch, kv_len)

    def _prepare(self, batch: int, kv_len: int, *, run_once: bool) -> None:
        """Capture the pair's graph on its first use; with ``run_once``, also run the step once
        (eager or compiled) on padding rows. Both touch only the scratch slot."""
        key = (batch, kv_len)
        if key in self._prepared and not run_once:
            return
        if self._capturer is not None:
            if key not in self._graphs:
                self._fill_padding(batch)
                self._graphs[key] = self._capturer.capture(functools.partial(self._call_step, batch, kv_len))
        elif run_once:
            self._fill_padding(batch)
            self._call_step(batch, kv_len)
        self._prepared.add(key)

    def _padding_row(self) -> list[int]:
        return [0, self._scratch_slot, 0]  # token 0 at position 0 of the scratch slot

    def _fill_padding(self, batch: int) -> None:
        self._inputs[batch].copy_(torch.tensor([self._padding_row()] * batch, dtype=torch.int64))

    def _buckets_covering(
        self, buckets: tuple[int, ...], sizes: Iterable[int] | None, name: str
    ) -> list[int]:
        if sizes is None:
            return list(buckets)
        chosen = set()
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= buckets[-1]:
                raise GraphDecodeConfigError(f"{name} {size!r} outside 1..{buckets[-1]}")
            chosen.add(_bucket_for(buckets, size))
        return sorted(chosen)
