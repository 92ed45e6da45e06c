"""Build a backend and its TTSEngine from the config's ``tts``, ``engine`` and ``gpu`` sections.

The one place backends are built: the engine worker (``python -m tts_engine serve``) calls it with the
config file (or stdin line) it was given, and the gateway's in-process engine (gateway/services.py) with
its validated config dumped to dicts. The sections are read into :class:`tts_engine.settings.Settings`
(plain dataclasses: the worker runs where only torch, numpy and msgpack are installed, without pydantic),
which own every key's default. The file is JSON (what ``python -m gateway serve`` writes for the workers
it starts) or YAML (a hand-written config.yaml; needs PyYAML, which CosyVoice needs anyway).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tts_engine.backends import Backend, create_backend
from tts_engine.engine import TTSEngine
from tts_engine.gpu_share import apply_engine_share
from tts_engine.settings import Settings
from tts_engine.text_normalization import TextNormalizer

Sections = Mapping[str, Any] | Settings  # the sections as plain dicts, or already read


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


def _settings(config: Sections) -> Settings:
    return config if isinstance(config, Settings) else Settings.from_config(config)


def build_backend(
    name: str,
    device: str,
    config: Sections,
    options: dict[str, Any] | None = None,
    *,
    own_process: bool = True,
) -> Backend:
    """The backend ``name`` on ``device``; ``options`` are constructor keywords (fake, gpu-sim, espeak).

    ``own_process``: the engine is alone in this process (a worker), so the process is capped at the
    engine's share of the GPU plan; False when it shares the gateway's process with the ASR."""
    settings = _settings(config)
    tts, engine, gpu = settings.tts, settings.engine, settings.gpu
    if name == "gpu-sim":
        return create_backend(name, **{**dataclasses.asdict(tts.gpu_sim), **(options or {})})
    if name != "cosyvoice":
        return create_backend(name, **(options or {}))
    from tts_engine.backends.cosyvoice import resolve_device
    from tts_engine.memory import MemoryBudget

    device = str(resolve_device(device))
    apply_engine_share(  # the engine's share of the GPU plan, added to this process's cap
        device,
        memory_gib=gpu.memory_gib,
        asr_memory_gib=gpu.asr_memory_gib,
        engine_gpu_memory_gib=engine.gpu_memory_gib,
        own_process=own_process,
    )
    return create_backend(
        "cosyvoice",
        model_dir=tts.model_dir,
        device=device,
        dtype=tts.dtype,
        voice_cache_dir=Path(tts.voices_dir) / ".cache",
        default_voice=tts.voice,
        memory_budget=MemoryBudget.from_gib(settings.engine_memory_gib, device),
        max_batch_size=engine.max_batch_size,
        max_llm_len=engine.max_llm_len,
        llm_backend=engine.llm_backend,
        max_hop_rows=engine.max_hop_rows,
        cuda_graphs=engine.cuda_graphs,
        torch_compile=engine.torch_compile,
        flow_cache=engine.flow_cache,
        flow_cache_mib=engine.flow_cache_mib,
        flow_cache_warm=engine.flow_cache_warm,
        final_pass=engine.final_pass,
        step_order=engine.step_order,
        **({"max_prefill_rows": engine.max_prefill_rows} if engine.max_prefill_rows else {}),
        **(options or {}),
    )


def build_engine(
    backend_name: str, device: str, config: Sections, options: dict[str, Any] | None = None
) -> TTSEngine:
    settings = _settings(config)
    threads = settings.tts.cpu_threads
    torch.set_num_threads(threads or (torch.get_num_threads() if backend_name == "cosyvoice" else 1))
    return engine_for_backend(build_backend(backend_name, device, settings, options), settings)


def engine_for_backend(backend: Backend, config: Sections) -> TTSEngine:
    """The engine around ``backend``, with the ``tts``/``engine`` sections' queue limits and text normaliser
    (without wetext installed it falls back to the basic one)."""
    settings = _settings(config)
    tts = settings.tts
    normalizer = None
    if not backend.reads_raw_text and tts.text_normalization != "off":
        normalizer = TextNormalizer(tts.text_normalization)
    return TTSEngine(
        backend,
        max_pending_requests=tts.max_pending_requests,
        max_buffered_chunks=tts.max_buffered_chunks,
        max_queue_wait_s=settings.engine.max_queue_wait_s,
        text_normalizer=normalizer,
    )
