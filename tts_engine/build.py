"""Build a backend and its TTSEngine from the config's ``tts``, ``engine`` and ``gpu`` sections as plain dicts.

The one place backends are built: the engine worker (``python -m tts_engine serve``) calls it with the
config file it was given, and the gateway's in-process engine (gateway/services.py) with its validated
config dumped to dicts. The worker must run where only torch, numpy and msgpack are installed (a GPU box
without the gateway's web stack or pydantic), so missing keys take the same defaults as
gateway/config.py. The file is JSON (what ``python -m gateway serve`` writes for the workers it starts)
or YAML (a hand-written config.yaml; needs PyYAML, which CosyVoice needs anyway).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from tts_engine.backends import Backend, create_backend
from tts_engine.engine import TTSEngine
from tts_engine.gpu_share import apply_engine_share

log = logging.getLogger(__name__)

DEFAULT_ENGINE_MEMORY_GIB = 6.0


def read_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        import yaml  # a hand-written config.yaml

        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a mapping")
    return data


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    section = config.get(name) or {}
    return section if isinstance(section, dict) else {}


def build_backend(
    name: str,
    device: str,
    config: dict[str, Any],
    options: dict[str, Any] | None = None,
    *,
    own_process: bool = True,
) -> Backend:
    """The backend ``name`` on ``device``; ``options`` are constructor keywords (fake, gpu-sim, espeak).

    ``own_process``: the engine is alone in this process (a worker), so the process is capped at the
    engine's share of the GPU plan; False when it shares the gateway's process with the ASR."""
    tts, engine, gpu = _section(config, "tts"), _section(config, "engine"), _section(config, "gpu")
    if name == "gpu-sim":
        return create_backend(name, **{**_section(tts, "gpu_sim"), **(options or {})})
    if name != "cosyvoice":
        return create_backend(name, **(options or {}))
    from tts_engine.backends.cosyvoice import resolve_device
    from tts_engine.memory import MemoryBudget

    device = str(resolve_device(device))
    apply_engine_share(  # the engine's share of the GPU plan, added to this process's cap
        device,
        memory_gib=float(gpu.get("memory_gib") or 0),
        asr_memory_gib=float(gpu.get("asr_memory_gib", 2.0)),
        engine_gpu_memory_gib=engine.get("gpu_memory_gib"),
        own_process=own_process,
    )
    budget = engine.get("gpu_memory_gib")
    if budget is None:
        total, asr = float(gpu.get("memory_gib") or 0), float(gpu.get("asr_memory_gib", 2.0))
        budget = (total - asr) if total else DEFAULT_ENGINE_MEMORY_GIB
    return create_backend(
        "cosyvoice",
        model_dir=tts.get("model_dir", "models/Fun-CosyVoice3-0.5B"),
        device=device,
        dtype=tts.get("dtype", "auto"),
        voice_cache_dir=Path(tts.get("voices_dir", "voices")) / ".cache",
        default_voice=tts.get("voice", "default"),
        memory_budget=MemoryBudget.from_gib(float(budget), device),
        max_batch_size=int(engine.get("max_batch_size", 64)),
        max_llm_len=int(engine.get("max_llm_len", 4096)),
        llm_backend=engine.get("llm_backend", "native"),
        max_hop_rows=int(engine.get("max_hop_rows", 16)),
        cuda_graphs=bool(engine.get("cuda_graphs", False)),
        torch_compile=bool(engine.get("torch_compile", False)),
        flow_cache=bool(engine.get("flow_cache", True)),
        flow_cache_mib=engine.get("flow_cache_mib"),
        flow_cache_warm=bool(engine.get("flow_cache_warm", True)),
        final_pass=engine.get("final_pass", "exact"),
        **({"max_prefill_rows": engine["max_prefill_rows"]} if engine.get("max_prefill_rows") else {}),
        **(options or {}),
    )


def build_engine(
    backend_name: str, device: str, config: dict[str, Any], options: dict[str, Any] | None = None
) -> TTSEngine:
    tts = _section(config, "tts")
    threads = int(tts.get("cpu_threads", 0) or 0)
    torch.set_num_threads(threads or (torch.get_num_threads() if backend_name == "cosyvoice" else 1))
    return engine_for_backend(build_backend(backend_name, device, config, options), config)


def engine_for_backend(backend: Backend, config: dict[str, Any]) -> TTSEngine:
    """The engine around ``backend``, with the ``tts``/``engine`` sections' queue limits and text normaliser."""
    tts, engine = _section(config, "tts"), _section(config, "engine")
    normalizer = None
    if not backend.reads_raw_text and tts.get("text_normalization", "wetext") != "off":
        try:
            from tts_engine.text_normalization import TextNormalizer

            normalizer = TextNormalizer(tts.get("text_normalization", "wetext"))
        except ImportError as exc:  # the worker still serves, reading text as written
            log.warning("text normalisation is off in this worker: %s", exc)
    return TTSEngine(
        backend,
        max_pending_requests=int(tts.get("max_pending_requests", 256)),
        max_buffered_chunks=int(tts.get("max_buffered_chunks", 8)),
        max_queue_wait_s=float(engine.get("max_queue_wait_s", 30)),
        text_normalizer=normalizer,
    )
