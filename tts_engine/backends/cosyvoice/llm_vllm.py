"""Optional vLLM token generator for the CosyVoice3 speech LM (``engine.llm_backend: vllm``).

UNTESTED AGAINST A REAL vLLM: vLLM is not installed in CI (too large, needs a GPU). The routing and
stop logic below is exercised by ``tests/test_llm_vllm.py`` with a stand-in engine; the vLLM calls
follow the documented V1 offline API (vLLM 0.11: ``EngineArgs(enable_prompt_embeds=True,
skip_tokenizer_init=True)``, ``LLMEngine.add_request(id, {"prompt_embeds": [L, H]}, SamplingParams)``,
``LLMEngine.step()``, ``abort_request``). Install with ``pip install .[vllm]``.

Role: a drop-in for :class:`cosyvoice.llm.LLMRunner` in the CosyVoice backend - ``prefill`` admits
:class:`~cosyvoice.llm.LLMRequest` objects, ``decode_step`` returns each given request's next token as a
:class:`~cosyvoice.llm.StepOutput`, ``abort`` drops one. The engine runs the exported speech-only Qwen2
(:func:`cosyvoice.tools.export_hf.export_qwen2_hf`, written to ``<model_dir>/vllm`` on first use); the
prompt (sos, text, task_id, prompt speech) is embedded by our own model and passed as prompt embeddings.

vLLM advances *every* running request on each ``step()``, while the backend asks per call for the
requests it lists; tokens that arrive for other requests wait in a per-request queue until asked for.

Sampling choice - vLLM's own sampler, per request:
``SamplingParams(temperature=1, top_k=ras.top_k, top_p=ras.top_p, min_tokens=min_len,
max_tokens=max_len, stop_token_ids=6561..6760, seed=<drawn from the request's generator>)``.
vLLM's API gives no hook to replace the sampled token, and a V1 logits processor only sees logits, so
RAS cannot be replayed exactly. Parity limits against the native runner (same as upstream's vLLM path):

- no repetition-aware resampling (a token repeated in the last ``win_size`` is not redrawn);
- vLLM renormalises over the top-k before applying top-p, RAS accumulates unrenormalised
  probabilities, so the nucleus can be a little smaller;
- different random streams: a fixed seed is reproducible with vLLM but gives other tokens than native;
- ``min_tokens`` masks *every* stop id before ``min_len`` (the native ``mask_all_stops_before_min=True``),
  not only id 6561 as the reference quirk does;
- bf16/fp16 kernels (``dtype``) change the logits slightly.

The silent-token filter and the stop rule (any id >= 6561 ends a request and is never emitted) are
applied here exactly as natively. The native model object is still needed for the prompt embeddings;
its Qwen layers stay loaded (not freed).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from cosyvoice.llm import (
    CosyVoice3LM,
    LLMRequest,
    StepOutput,
    check_new_requests,
    check_running_requests,
)
from cosyvoice.tools.export_hf import export_qwen2_hf, read_export_info

__all__ = ["VLLMRunner", "VLLMRunnerError", "VLLMUnavailableError", "default_export_dir", "ensure_export"]

INSTALL_HINT = "pip install .[vllm]"
_EMBED_DTYPES = {
    "float32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16,
}  # fmt: skip


class VLLMUnavailableError(ImportError):
    """``engine.llm_backend: vllm`` was chosen but the vllm package cannot be imported."""


class VLLMRunnerError(RuntimeError):
    """The vLLM engine did not produce what a request needs (e.g. it dropped the request)."""


def _import_vllm() -> Any:
    try:
        import vllm  # noqa: PLC0415 - optional dependency, imported only for this backend
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415
    except ImportError as exc:
        raise VLLMUnavailableError(
            f"engine.llm_backend: vllm needs the vllm package ({INSTALL_HINT}): {exc}"
        ) from exc
    return vllm, RequestOutputKind


def default_export_dir(model_dir: str | Path, *, use_rl_llm: bool = False) -> Path:
    return Path(model_dir) / ("vllm-rl" if use_rl_llm else "vllm")


def ensure_export(model_dir: str | Path, *, use_rl_llm: bool = False, export_dir: Path | None = None) -> Path:
    """The HF export of ``model_dir``'s LLM, written (float32) when missing, like upstream's ``load_vllm``."""
    out = default_export_dir(model_dir, use_rl_llm=use_rl_llm) if export_dir is None else Path(export_dir)
    if not out.exists():
        export_qwen2_hf(model_dir, out, use_rl_llm=use_rl_llm)
    read_export_info(out)  # refuse a directory that is not our export
    return out


class _Positions:
    """The subset of :class:`cosyvoice.llm.qwen2.KVCache` the backend reads: a per-slot progress count."""

    def __init__(self, max_batch: int, max_len: int) -> None:
        self.max_batch = max_batch
        self.max_len = max_len
        self.lengths: dict[int, int] = {}

    def length(self, slot: int) -> int:
        return self.lengths[slot]


@dataclasses.dataclass(eq=False)
class _Tracked:
    request_id: str
    pending: deque[int] = dataclasses.field(default_factory=deque)  # tokens vLLM made, not yet handed out
    engine_done: bool = False


class VLLMRunner:
    """Generates speech tokens for :class:`LLMRequest` objects with a vLLM ``LLMEngine``.

    ``engine`` / ``vllm_api`` let a caller (or a test) supply the engine and the module that provides
    ``SamplingParams`` and ``RequestOutputKind``; by default both come from ``vllm``.
    """

    def __init__(
        self,
        model: CosyVoice3LM,
        export_dir: str | Path,
        *,
        max_batch: int,
        max_len: int,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.2,
        engine_kwargs: dict[str, Any] | None = None,
        engine: Any | None = None,
        vllm_api: tuple[Any, Any] | None = None,
    ) -> None:
        if max_batch < 1 or max_len < 1:
            raise ValueError("max_batch and max_len must be >= 1")
        self.model = model
        self.export_dir = Path(export_dir)
        info = read_export_info(self.export_dir)
        self.stop_from = int(info["speech_token_size"])
        self.vocab_size = int(info["speech_vocab_size"])
        if self.stop_from != model.speech_token_size:
            raise VLLMRunnerError(f"{self.export_dir} was exported for another speech vocabulary")
        self._vllm, self._output_kind = _import_vllm() if vllm_api is None else vllm_api
        if engine is None:
            args = self._vllm.EngineArgs(
                model=str(self.export_dir),
                skip_tokenizer_init=True,
                enable_prompt_embeds=True,
                dtype=dtype,
                max_model_len=max_len + 1,  # prefix + max_len tokens fits a native slot of max_len
                max_num_seqs=max_batch,
                gpu_memory_utilization=gpu_memory_utilization,
                **(engine_kwargs or {}),
            )
            engine = self._vllm.LLMEngine.from_engine_args(args)
        self.engine = engine
        self.embed_dtype = _EMBED_DTYPES.get(dtype)  # None ("auto"): the native model's dtype
        self.cache = _Positions(max_batch, max_len)
        self._free = list(range(max_batch))
        self._tracked: dict[int, _Tracked] = {}  # by slot
        self._by_request_id: dict[str, _Tracked] = {}
        self._ids = itertools.count()

    @classmethod
    def from_model_dir(
        cls,
        model: CosyVoice3LM,
        model_dir: str | Path,
        *,
        use_rl_llm: bool = False,
        max_batch: int,
        max_len: int,
        **kwargs: Any,
    ) -> VLLMRunner:
        """Export the LLM to ``<model_dir>/vllm`` if needed and start an engine on it."""
        if kwargs.get("vllm_api") is None:
            _import_vllm()  # fail before a long export
        export_dir = ensure_export(model_dir, use_rl_llm=use_rl_llm)
        return cls(model, export_dir, max_batch=max_batch, max_len=max_len, **kwargs)

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    # -- the LLMRunner interface -----------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, requests: Sequence[LLMRequest]) -> list[StepOutput]:
        if not requests:
            return []
        check_new_requests(requests, max_len=self.cache.max_len, free_slots=len(self._free))
        for request in requests:
            embeds = self.model.embed_prompt(request.prompt).detach().to("cpu")  # [L, H]
            if self.embed_dtype is not None:
                embeds = embeds.to(self.embed_dtype)
            request_id = f"cosyvoice-{next(self._ids)}"
            self.engine.add_request(request_id, {"prompt_embeds": embeds}, self._sampling_params(request))
            slot = self._free.pop(0)
            tracked = _Tracked(request_id)
            self._tracked[slot] = tracked
            self._by_request_id[request_id] = tracked
            self.cache.lengths[slot] = 0
            request.slot = slot
        return self._next_tokens(requests)

    @torch.inference_mode()
    def decode_step(self, requests: Sequence[LLMRequest]) -> list[StepOutput]:
        if not requests:
            return []
        check_running_requests(requests)
        return self._next_tokens(requests)

    def abort(self, request: LLMRequest) -> None:
        """Finish ``request`` now and drop it from the engine (no-op when already released)."""
        request.finished = True
        self._release(request)

    # -- internals -----------------------------------------------------------------------------

    def _sampling_params(self, request: LLMRequest) -> Any:
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=request.generator).item())
        return self._vllm.SamplingParams(
            n=1,
            temperature=1.0,
            top_k=request.ras.top_k,
            top_p=request.ras.top_p,
            min_tokens=min(request.min_len, request.max_len),
            max_tokens=request.max_len,
            stop_token_ids=list(range(self.stop_from, self.vocab_size)),
            seed=seed,
            detokenize=False,
            output_kind=self._output_kind.DELTA,
        )

    def _next_tokens(self, requests: Sequence[LLMRequest]) -> list[StepOutput]:
        """Step the engine until each request has a token (or an end) waiting, then hand out one each."""
        tracked = [self._tracked[r.slot] for r in requests]  # type: ignore[index]
        while any(not t.pending and not t.engine_done for t in tracked):
            if not self.engine.has_unfinished_requests():
                raise VLLMRunnerError("the vLLM engine has no running requests but tokens are missing")
            for output in self.engine.step():
                target = self._by_request_id.get(output.request_id)
                if target is None:
                    continue  # aborted meanwhile
                target.pending.extend(int(t) for t in output.outputs[0].token_ids)
                target.engine_done = target.engine_done or bool(output.finished)
        return [self._advance(r, t) for r, t in zip(requests, tracked, strict=True)]

    def _advance(self, request: LLMRequest, tracked: _Tracked) -> StepOutput:
        if not tracked.pending:  # the engine ended the request without another token
            request.finished = True
            self._release(request)
            return StepOutput(None, False, True)
        token = tracked.pending.popleft()
        self.cache.lengths[request.slot] += 1  # type: ignore[index]
        if token >= self.stop_from:
            request.finished, request.stop_token = True, token
            self._release(request)
            return StepOutput(None, False, True)
        request.out_tokens.append(token)
        to_flow = request.silent_filter.accept(token)
        if to_flow:
            request.flow_tokens.append(token)
        request.finished = len(request.out_tokens) >= request.max_len or (
            tracked.engine_done and not tracked.pending
        )
        if request.finished:
            self._release(request)
        return StepOutput(token, to_flow, request.finished)

    def _release(self, request: LLMRequest) -> None:
        slot = request.slot
        if slot is None:
            return
        tracked = self._tracked.pop(slot)
        self._by_request_id.pop(tracked.request_id, None)
        if not tracked.engine_done:
            self.engine.abort_request([tracked.request_id])
        self.cache.lengths.pop(slot, None)
        self._free.append(slot)
        self._free.sort()
        request.slot = None
