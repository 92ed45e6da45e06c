"""The engine's settings: the config's ``tts``, ``engine`` and ``gpu`` sections as plain dataclasses.

Each key's type, default and bounds are written here, once. An engine worker (``python -m tts_engine
serve``) reads the sections it is given with the standard library alone (a GPU box has no pydantic):
:meth:`Settings.from_config` takes them as plain dicts and a bad value raises ValueError naming its key.
The gateway derives its pydantic ``tts``/``engine``/``gpu`` config sections from these fields
(gateway/config/engine.py), so config.yaml, ``XZ_<SECTION>__<KEY>`` and every worker agree by
construction. Keys the engine has no use for (the gateway's own ``engine.workers``, ``remote``,
``worker_*``: the gateway validates them) are ignored here.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from tts_engine.text_normalization.normalizer import TextNormalization

__all__ = [
    "DEFAULT_ENGINE_MEMORY_GIB",
    "EngineSettings",
    "GPUSettings",
    "GpuSimSettings",
    "Settings",
    "TTSSettings",
    "setting",
]

BOUNDS = "bounds"  # a field's metadata key: {"ge": 1, "le": 256, ...} (pydantic's Field keywords)
DEFAULT_ENGINE_MEMORY_GIB = 6.0  # the engine's budget when neither engine.gpu_memory_gib nor a gpu plan says
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
_COMPARE = {"ge": (">=", operator.ge), "gt": (">", operator.gt), "le": ("<=", operator.le)}


def setting(default: Any, **bounds: float) -> Any:
    """A key with its default and its bounds (``ge``, ``gt``, ``le``; checked on None-free values)."""
    unknown = set(bounds) - set(_COMPARE)
    if unknown:
        raise TypeError(f"unknown bounds {sorted(unknown)}")
    return field(default=default, metadata={BOUNDS: bounds})


class _Section:
    """What every section does: typed, bounded keys checked at construction, and read from a dict."""

    SECTION: ClassVar[str]

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            key = f"{self.SECTION}.{f.name}"
            value = _typed(key, hints[f.name], getattr(self, f.name))
            for name, bound in f.metadata.get(BOUNDS, {}).items():
                sign, holds = _COMPARE[name]
                if value is not None and not holds(value, bound):
                    raise ValueError(f"{key} must be {sign} {bound}, got {value!r}")
            object.__setattr__(self, f.name, value)
        self._check()

    def _check(self) -> None:
        """Rules across keys (a subclass's)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Any:
        """The section from its config mapping: missing keys take their defaults, others are not ours."""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ValueError(f"{cls.SECTION} must be a mapping, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{key: value for key, value in data.items() if key in names})


def _typed(key: str, annotation: Any, value: Any) -> Any:
    """``value`` as ``annotation`` (an int is a float, a mapping a nested section), or ValueError."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # X | None
        if value is None:
            return None
        (annotation,) = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        if not any(value == choice and type(value) is type(choice) for choice in choices):
            raise ValueError(f"{key} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        section: Any = annotation
        return value if isinstance(value, section) else section.from_dict(value)
    if annotation is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, annotation) or (annotation is int and isinstance(value, bool)):
        raise ValueError(f"{key} must be {_KINDS.get(annotation, annotation.__name__)}, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class GpuSimSettings(_Section):
    """The gpu-sim benchmark backend (tts_engine/backends/gpu_sim.py): each batched step holds the GIL
    for python_ms (kernel launches) then waits step_ms with it released (the GPU computing)."""

    SECTION: ClassVar[str] = "tts.gpu_sim"

    step_ms: float = setting(20, ge=0, le=10000)
    python_ms: float = setting(5, ge=0, le=10000)
    chunk_ms: int = setting(40, ge=1, le=2000)  # audio per stream per step
    hop_chunks: int = setting(5, ge=1, le=1000)  # steps whose audio leaves as one chunk
    max_batch_size: int = setting(128, ge=1, le=1024)


@dataclass(frozen=True, kw_only=True)
class TTSSettings(_Section):
    """Which backend speaks, with which model, voices and queue limits."""

    SECTION: ClassVar[str] = "tts"

    backend: Literal["auto", "espeak", "fake", "gpu-sim", "cosyvoice"] = "auto"
    voice: str = "default"
    model_dir: str = "models/Fun-CosyVoice3-0.5B"
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    voices_dir: str = "voices"
    max_pending_requests: int = setting(256, ge=1)
    max_buffered_chunks: int = setting(8, ge=1)
    cpu_threads: int = setting(0, ge=0, le=256)
    # numbers, dates, units... read out before the backend gets the text (tts_engine/text_normalization/)
    text_normalization: TextNormalization = "wetext"
    gpu_sim: GpuSimSettings = field(default_factory=GpuSimSettings)


@dataclass(frozen=True, kw_only=True)
class GPUSettings(_Section):
    """One GPU memory plan per process, split between the TTS engine and ASR."""

    SECTION: ClassVar[str] = "gpu"

    memory_gib: float = setting(0, ge=0)
    asr_memory_gib: float = setting(2.0, ge=0)

    def _check(self) -> None:
        if self.memory_gib and self.asr_memory_gib >= self.memory_gib:
            raise ValueError("gpu.asr_memory_gib must be smaller than gpu.memory_gib")

    @property
    def tts_memory_gib(self) -> float | None:
        """The TTS engine's share (None: no cap)."""
        return self.memory_gib - self.asr_memory_gib if self.memory_gib else None


@dataclass(frozen=True, kw_only=True)
class EngineSettings(_Section):
    """The shared TTS engine: batching and its memory budget (docs/gpu-sharing.md)."""

    SECTION: ClassVar[str] = "engine"

    # GiB (> 1) or a fraction of the device (0 < x <= 1); None: gpu's TTS share, else 6 GiB.
    gpu_memory_gib: float | None = setting(None, gt=0)
    max_queue_wait_s: float = setting(30, gt=0)  # a request waiting longer for capacity fails
    max_batch_size: int = setting(64, ge=1, le=256)  # KV slots at most (the budget may allow fewer)
    max_llm_len: int = setting(4096, ge=64, le=65536)  # KV positions per slot
    llm_backend: Literal["native", "vllm"] = "native"  # vllm: pip install .[vllm], needs CUDA
    # flow + vocoder rows per step; more ready hops wait a step, least playback slack served first
    max_hop_rows: int = setting(16, ge=1, le=256)
    # new LLM segments prefilled per step (None: all that are waiting); the rest a step later, in slack order
    max_prefill_rows: int | None = setting(None, ge=1, le=256)
    torch_compile: bool = False  # DiT step + vocoder through torch.compile (inductor); unmeasured on GPU
    cuda_graphs: bool = False  # decode step as CUDA graphs (CUDA + native LLM only); unmeasured, so off
    # Flow chunk caches (per-voice prompt prefix, per-stream chunks): exact, only new frames computed.
    flow_cache: bool = True
    flow_cache_mib: float | None = setting(None, ge=0)  # None: what the memory plan leaves over
    flow_cache_warm: bool = True  # a voice's prompt chunks are computed when it is added, not at first use
    # streaming: the closing flow call keeps the chunk mask
    final_pass: Literal["exact", "streaming"] = "exact"
    # slack: urgent hops first and handed out early, comfortable ones after or later; together: one batch
    step_order: Literal["slack", "together"] = "slack"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The three sections an engine is built from (tts_engine/build.py)."""

    tts: TTSSettings = field(default_factory=TTSSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    gpu: GPUSettings = field(default_factory=GPUSettings)

    def __post_init__(self) -> None:
        share, budget = self.gpu.tts_memory_gib, self.engine.gpu_memory_gib
        if share is not None and budget is not None and budget > 1 and budget > share:
            raise ValueError(
                f"engine.gpu_memory_gib ({budget}) exceeds the TTS share of the GPU plan "
                f"(gpu.memory_gib - gpu.asr_memory_gib = {share})"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> Settings:
        """The sections of a config mapping (a config file, or what a gateway sends its workers)."""
        config = config or {}
        return cls(
            tts=TTSSettings.from_dict(config.get("tts")),
            engine=EngineSettings.from_dict(config.get("engine")),
            gpu=GPUSettings.from_dict(config.get("gpu")),
        )

    @property
    def engine_memory_gib(self) -> float:
        """The engine's memory budget: its own key, else the gpu plan's TTS share, else 6 GiB."""
        if self.engine.gpu_memory_gib is not None:
            return self.engine.gpu_memory_gib
        share = self.gpu.tts_memory_gib
        return DEFAULT_ENGINE_MEMORY_GIB if share is None else share
