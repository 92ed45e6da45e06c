"""CosyVoice3 backend: continuous-batched LLM plus batched token2wav, one scheduler step per ``step()``.

One ``step(streams, budget)`` call advances every given request by one scheduler step: a batched LLM
decode (and prefill: at most the budget's ``prefill_rows`` new segments) step, then the ready token2wav
hops in one flow + vocoder batch of at most the budget's ``hop_rows`` rows, taken in the order the
engine ranked the streams (step.py). Each request gets the audio its hop produced (float32,
24 kHz), an empty array while nothing is ready, ``None`` once its last sample was delivered, or the
exception that failed it; one bad request does not fail its neighbours.

Voices come from presets (``add_voice``), their recordings prepared once and cached on disk in
``voice_cache_dir`` (tts_engine/backends/cosyvoice/voices.py). Modes per request:
zero-shot (the preset's transcript + prompt speech tokens in the LLM prompt) and instruct (an
instruction from the request or the preset; the LLM sees no prompt speech). The flow always gets the
speaker's prompt tokens, mel and x-vector. A preset needs its transcript (``prompt_text``).

Sampling: each text segment gets its own CPU ``torch.Generator``, seeded from ``seed`` and the
segment's content (its audio does not depend on what shares its batch), else from fresh randomness.

Admission: ``limits()`` declares the KV slots as ``max_streams`` (and ``max_prefill_rows``,
``max_hop_rows`` as the per-step caps); the engine's scheduler opens at most that many streams at once
and queues the rest, so an open stream always finds a slot for its next segment.
Chunks are returned as float tensors on the model's device: the engine resamples and converts them
to int16 there, in one batch per step.

``speed != 1`` follows upstream: that request is synthesised offline (full-attention flow once the LLM
is done) and its mel is time-scaled by linear interpolation; its first audio comes later.

Memory: the KV cache holds ``max_batch_size`` slots of ``max_llm_len`` positions; with a
``memory_budget`` the slot count is planned from it (runtime.py, tts_engine/memory.py), at most
``max_batch_size``.

CUDA graphs (``cuda_graphs=True``, CUDA and the native LLM only): the decode step runs as
``cosyvoice.llm.graph_decode.GraphDecodeRunner``, one graph per (batch bucket, KV length bucket), all
captured at start-up; its graph pool (one decode step's activations, far below a flow hop's) fits the
per-row reserve. Elsewhere the flag is ignored with a warning. Not yet measured on a GPU, hence off.

Flow cache (``flow_cache=True``, the default): complete flow chunks are computed once and reused
(cosyvoice/flow/chunk_cache.py): each voice's prompt chunks that depend on the voice alone (computed
when the voice is added, ``flow_cache_warm=True``, else taken from its first stream; shared by every
later one, dropped when the voice is removed or overwritten) and each stream's own chunks across its
hops. Exact up to floating point rounding. Its bytes come from the memory plan (``flow_cache_mib``,
else what the plan leaves; 2 GiB without a budget); least recently used voice prefixes are evicted
first, and a stream that finds no room recomputes. ``final_pass="streaming"`` keeps the chunk mask for
a request's closing flow call too, so that call computes only its new frames (not upstream's numbers:
docs/gpu-sharing.md says how far).

``torch_compile=True`` compiles the flow estimator's step and the vocoder with inductor
(``cosyvoice.token2wav.compile``; the first hops of each shape class pay the compile).

Benchmarks: ``fixed_llm_tokens=N`` makes every text segment generate exactly N speech tokens (stop
tokens masked until N, stop at N), so random weights do the work of real speech; a callable gives each
segment's N from its text (scripts/bench_traffic.py: about as long as the text takes to say).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosyvoice.flow.chunk_cache import FlowCacheManager
from cosyvoice.flow.errors import FlowError
from cosyvoice.frontend.speaker import SpeakerError
from cosyvoice.llm import LLMRunner
from cosyvoice.model import CosyVoice3
from tts_engine.backends.base import Backend
from tts_engine.backends.cosyvoice.flow_warm import warm_voice_prefix
from tts_engine.backends.cosyvoice.request import (
    CosyVoiceStream,
)
from tts_engine.backends.cosyvoice.runtime import (
    kv_cache_bytes,
    load_model,
    make_flow_cache,
    make_runner,
    plan_memory,
)
from tts_engine.backends.cosyvoice.segments import open_segments
from tts_engine.backends.cosyvoice.step import HOP_KINDS, STEP_ORDERS, BatchedStep
from tts_engine.backends.cosyvoice.voices import (
    PreparedVoice,
    model_fingerprint,
    prepare_record,
    preset_record,
)
from tts_engine.budget import BackendLimits, StepBudget
from tts_engine.memory import MemoryBudget, MemoryPlan, module_bytes
from tts_engine.voices import PromptAudio, VoiceError, VoicePreset

__all__ = ["SAMPLE_RATE", "CosyVoiceBackend"]

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
DEFAULT_MAX_BATCH = 16
DEFAULT_MAX_LLM_LEN = 4096
DEFAULT_MAX_TEXT_CHARS = 2000


class CosyVoiceBackend(Backend):
    """CosyVoice3 (Fun-CosyVoice3-0.5B-2512) from an official model directory; 24 kHz output."""

    name = "cosyvoice"
    sample_rate = SAMPLE_RATE
    supports_cloning = True
    supports_instruct = True

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        model: CosyVoice3 | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype = "auto",
        use_rl_llm: bool = False,
        max_batch_size: int = DEFAULT_MAX_BATCH,
        max_llm_len: int = DEFAULT_MAX_LLM_LEN,
        max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
        seed: int | None = None,
        voice_cache_dir: str | Path | None = None,
        default_voice: str = "default",
        max_segment_seconds: float | None = None,
        memory_budget: MemoryBudget | None = None,
        fixed_llm_tokens: int | Callable[[str], int] | None = None,
        llm_backend: str = "native",
        max_hop_rows: int | None = None,
        max_prefill_rows: int | None = None,
        cuda_graphs: bool = False,
        torch_compile: bool = False,
        flow_cache: bool = True,
        flow_cache_mib: float | None = None,
        final_pass: str = "exact",
        flow_cache_warm: bool = True,
        step_order: str = "slack",
    ) -> None:
        step_caps = BackendLimits(max_prefill_rows=max_prefill_rows, max_hop_rows=max_hop_rows)  # checked now
        if final_pass not in ("exact", "streaming"):
            raise ValueError(f"final_pass must be 'exact' or 'streaming', got {final_pass!r}")
        if flow_cache_mib is not None and flow_cache_mib < 0:
            raise ValueError(f"flow_cache_mib must be >= 0 or None, got {flow_cache_mib!r}")
        if llm_backend not in ("native", "vllm"):
            raise ValueError(f"llm_backend must be 'native' or 'vllm', got {llm_backend!r}")
        if max_batch_size < 1 or max_llm_len < 1 or max_text_chars < 1:
            raise ValueError("max_batch_size, max_llm_len and max_text_chars must be >= 1")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        if model is None:
            model = load_model(
                model_dir, device=device, dtype=dtype, use_rl_llm=use_rl_llm, max_seconds=max_segment_seconds
            )
        if fixed_llm_tokens is not None and not callable(fixed_llm_tokens):
            if isinstance(fixed_llm_tokens, bool) or not isinstance(fixed_llm_tokens, int) or fixed_llm_tokens < 1:
                raise ValueError(
                    f"fixed_llm_tokens must be a positive int, a callable or None, got {fixed_llm_tokens!r}"
                )
        self.model = model
        self.device = model.llm.speech_embedding.weight.device
        self.fixed_llm_tokens = fixed_llm_tokens
        self.fingerprint = model_fingerprint(model)
        self.memory_plan: MemoryPlan | None = None
        self.weights_bytes = module_bytes(model.llm, model.token2wav.flow, model.token2wav.hift)
        self.cuda_graphs = bool(cuda_graphs) and llm_backend == "native" and self.device.type == "cuda"
        if cuda_graphs and not self.cuda_graphs:
            log.warning("engine.cuda_graphs needs the native LLM on a CUDA device; running without graphs")
        if memory_budget is not None:
            self.memory_plan = plan_memory(
                model,
                memory_budget,
                weights_bytes=self.weights_bytes,
                cuda_graphs=self.cuda_graphs,
                max_llm_len=max_llm_len,
                max_batch_size=max_batch_size,
                flow_cache=flow_cache,
                flow_cache_mib=flow_cache_mib,
            )
            max_batch_size = self.memory_plan.num_slots
        if step_order not in STEP_ORDERS:
            raise ValueError(f"step_order must be one of {', '.join(STEP_ORDERS)}, got {step_order!r}")
        self.max_batch_size = max_batch_size
        self.max_llm_len = max_llm_len
        self.max_text_chars = max_text_chars
        self.seed = seed
        self.voice_cache_dir = None if voice_cache_dir is None else Path(voice_cache_dir)
        self._preferred_voice = default_voice
        self._voices: dict[str, PreparedVoice] = {}
        self._streams: set[int] = set()  # ids of open streams (debugging/metrics)
        self.runner = make_runner(
            model,
            llm_backend=llm_backend,
            cuda_graphs=self.cuda_graphs,
            use_rl_llm=use_rl_llm,
            max_batch=max_batch_size,
            max_len=max_llm_len,
        )
        self.compiled = None
        if torch_compile:  # the DiT step and the vocoder through inductor (cosyvoice/token2wav/compile.py)
            from cosyvoice.token2wav.compile import compile_token2wav

            self.compiled = compile_token2wav(model.token2wav, backend="inductor")
        # a CPU's flow call costs in proportion to its rows: openings apart, comfortable hops a row a call
        rows_cost = self.device.type == "cpu"
        self.stepper = BatchedStep(self.runner, model.token2wav, order=step_order, rows_cost=rows_cost)
        self._limits = BackendLimits(
            max_streams=max_batch_size,
            max_batch_size=max_batch_size,
            max_prefill_rows=step_caps.max_prefill_rows,
            max_hop_rows=step_caps.max_hop_rows,
            splits_steps=step_order == "slack",
            can_park=isinstance(self.runner, LLMRunner),  # the native runners' KV slots swap to the host
        )
        self.flow_cache: FlowCacheManager | None = None
        if flow_cache:
            self.flow_cache = make_flow_cache(self.memory_plan, flow_cache_mib)
        self.flow_cache_warm = bool(flow_cache_warm)  # fill a voice's prefix in add_voice
        self.final_pass = final_pass  # both per stream: the model may be shared by several backends

    # -- voices --------------------------------------------------------------------------------

    def voices(self) -> list[str]:
        return sorted(self._voices)

    @property
    def default_voice(self) -> str:  # type: ignore[override]
        if self._preferred_voice in self._voices or not self._voices:
            return self._preferred_voice
        return min(self._voices)

    def add_voice(self, preset: VoicePreset) -> None:
        """The preset's speaker record (from the voice cache, else prepared and cached; voices.py)."""
        record = preset_record(self.model, preset, self.voice_cache_dir, self.fingerprint)
        try:
            voice = PreparedVoice(self.model, record, preset.instruct)
        except SpeakerError as exc:
            raise VoiceError(f"voice {preset.name!r}: {exc}") from exc
        self._forget_flow_prefix(self._voices.get(preset.name))  # overwritten: its prefix is stale
        self._voices[preset.name] = voice
        self._warm_flow_prefix(preset.name, voice)

    def _warm_flow_prefix(self, name: str, voice: PreparedVoice) -> None:
        """Compute the voice's cached prompt chunks now, so its first request does not (flow_warm.py)."""
        if self.flow_cache is None or not self.flow_cache_warm:
            return
        try:
            warm_voice_prefix(self.model.token2wav, voice.flow_prompt, self.flow_cache)
        except FlowError as exc:  # the first request computes (or reports) it instead
            log.warning("voice %r: flow prompt cache not filled: %s", name, exc)

    def remove_voice(self, name: str) -> None:
        voice = self._voices.pop(name, None)
        if voice is None:
            raise VoiceError(f"voice {name!r} is not loaded in the cosyvoice backend")
        self._forget_flow_prefix(voice)

    def _forget_flow_prefix(self, voice: PreparedVoice | None) -> None:
        """Drop a voice's cached prompt chunks (streams already using them keep their reference)."""
        if voice is not None and self.flow_cache is not None:
            self.flow_cache.drop_voice(voice.flow_prompt)

    # -- requests ------------------------------------------------------------------------------

    def open_stream(
        self, text: str, voice: str, speed: float, instruct: str | None = None
    ) -> CosyVoiceStream:
        prepared = self._voices.get(voice)
        if prepared is None:
            raise VoiceError(f"unknown voice {voice!r}; loaded: {', '.join(self.voices()) or 'none'}")
        return self._open(text, prepared, speed, instruct or prepared.instruct, voice, shared=True)

    def open_zero_shot_stream(
        self, text: str, prompt: PromptAudio, prompt_text: str, speed: float, instruct: str | None = None
    ) -> CosyVoiceStream:
        try:
            prepared = PreparedVoice(self.model, prepare_record(self.model, prompt, prompt_text), None)
        except SpeakerError as exc:
            raise VoiceError(f"zero-shot prompt: {exc}") from exc
        return self._open(text, prepared, speed, instruct, "zero-shot")

    def _open(
        self,
        text: str,
        voice: PreparedVoice,
        speed: float,
        instruct: str | None,
        name: str,
        *,
        shared: bool = False,
    ) -> CosyVoiceStream:
        if self.max_text_chars is not None and len(text) > self.max_text_chars:
            raise ValueError(f"text is {len(text)} characters, the limit is {self.max_text_chars}")
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        segments = open_segments(
            self.model, text, voice, speed, instruct, name, seed=self.seed, fixed_llm_tokens=self.fixed_llm_tokens,
            max_llm_len=self.max_llm_len, shared=shared, flow_cache=self.flow_cache, final_pass=self.final_pass,
        )  # fmt: skip
        stream = CosyVoiceStream(owner=self, segments=segments, on_close=self._close_stream, voice=name)
        self._streams.add(id(stream))
        return stream

    def _close_stream(self, stream: CosyVoiceStream) -> None:
        for segment in stream.segments:
            if segment.llm.slot is not None or not segment.llm.finished:
                self.runner.abort(segment.llm)
            segment.wave.close()  # its flow chunk cache goes back to the budget
        self._streams.discard(id(stream))

    @property
    def num_open_streams(self) -> int:
        return len(self._streams)

    # -- capacity and memory -------------------------------------------------------------------

    def limits(self) -> BackendLimits:
        """KV cache slots as ``max_streams`` (every open stream holds one, for its current segment, until
        it closes) and the per-step prefill and hop row caps."""
        return self._limits

    def step_stats(self) -> dict[str, int | float]:
        stepper = self.stepper
        return {
            "hops_deferred": stepper.num_hops_deferred,
            "hops_held": stepper.num_hops_held,
            "closing_pauses": stepper.num_closing_pauses,
            "closing_progress_slices": stepper.num_progress_slices,
            "hop_slices": stepper.num_hop_slices,
            "vocoder_pieces": stepper.num_vocoder_pieces,
            "vocoder_pauses": stepper.num_vocoder_pauses,
            "llm_rows_held": stepper.num_llm_held,
            "opening_calls": stepper.num_opening_calls,
            "urgent_waits": stepper.num_urgent_waits,
            "one_call_openings_after": stepper.num_one_call_after,
            "urgent_pauses": stepper.num_urgent_pauses,
            "decode_bursts": stepper.num_burst_decodes,
            "decode_burst_rows": stepper.num_burst_rows,
            "decode_burst_riders": stepper.num_burst_riders,
            "decode_bursts_cut": stepper.num_bursts_cut,
            "decode_bursts_split": stepper.num_bursts_split,
            "steps_yielded": stepper.num_yields,
            "catch_up_decodes": stepper.num_catch_up_decodes,
            "prefills_deferred": stepper.num_prefills_deferred,
            "decode_graphs": getattr(self.runner, "num_graphs", 0),
            "llm_seconds_total": stepper.seconds["llm"],
            **{f"wave_{kind}_seconds_total": stepper.seconds[kind] for kind in HOP_KINDS},
        }

    # -- parking (the scheduler's batch streams) -----------------------------------------------

    def park(self, stream: Any) -> bool:
        """Free ``stream``'s KV slot, its cache copied to host memory (the native LLM runners only)."""
        if not self._limits.can_park or not isinstance(stream, CosyVoiceStream) or stream.owner is not self:
            return False
        stream.park(self.runner)
        return True

    def unpark(self, stream: Any) -> None:
        if isinstance(stream, CosyVoiceStream) and stream.owner is self:
            stream.unpark(self.runner)

    def memory_stats(self) -> dict[str, int | float]:
        stats: dict[str, int | float] = {
            "kv_slots": self.max_batch_size,
            "kv_slots_free": self.runner.num_free_slots,
            "open_streams": len(self._streams),
        }
        if self.memory_plan is not None:
            stats.update(self.memory_plan.as_stats())
        if self.flow_cache is not None:
            stats.update(self.flow_cache.stats())
        if self.device.type == "cuda":
            stats["memory_used_bytes"] = torch.cuda.memory_allocated(self.device)
            stats["memory_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        else:
            kv = kv_cache_bytes(self.model, max_batch=self.max_batch_size, max_len=self.max_llm_len)
            cache = 0 if self.flow_cache is None else self.flow_cache.used_bytes
            stats["memory_used_bytes"] = self.weights_bytes + kv + cache  # the KV pool is allocated whole
        return stats

    # -- one scheduler step --------------------------------------------------------------------

    def step(
        self,
        streams: Sequence[Any],
        budget: StepBudget | None = None,
        on_chunks: Callable[[list[tuple[int, Any]]], None] | None = None,
        should_yield: Callable[[], bool] | None = None,
    ) -> list[np.ndarray | None | BaseException]:
        """One step within ``budget`` (None: the declared limits', for callers without a scheduler);
        ``on_chunks`` gets the urgent lane's audio mid-step (step.py), by index in ``streams``; a true
        ``should_yield()`` after it leaves the work that can wait for the next step."""
        if budget is None:
            budget = self._limits.step_budget()
        return self.stepper.step_streams(self, streams, budget, on_chunks, should_yield)

    def close(self) -> None:
        self._voices.clear()
        if self.flow_cache is not None:
            self.flow_cache.clear()

