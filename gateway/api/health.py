"""``GET /v1/health``: for humans and probes; never needs an API key.

The gateway's summary (``status``: ``ok`` / ``degraded`` / ``unavailable`` with its ``reasons``, the HTTP
status 503 when unavailable; ``sessions``, ``tts``, ``llm``, ``asr``, ``audio``, and ``checks``: the
start-up model checks, ``[{name, status, detail, fix}]``, gateway/checks/model.py; see ``Services.health``) plus what TTS clients ask about: the compute ``device``, the ``engine`` and its
model and its worker processes (``engine.workers``), the ``voices`` on offer, and ``memory`` (the configured budget and what is in use).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.services import Services

router = APIRouter(tags=["health"])


@router.get("/v1/health")
async def health(request: Request) -> JSONResponse:
    """200 while the gateway can speak (``status`` ``ok`` or ``degraded``), 503 while it cannot
    (``unavailable``: no engine worker ready), so a load balancer's probe can act on the status alone."""
    report = health_report(request.app.state.services)
    return JSONResponse(report, status_code=503 if report["status"] == "unavailable" else 200)


def health_report(services: Services) -> dict[str, Any]:
    report = services.health()
    engine_health = report.get("tts") or services.engine.health()
    engine = services.engine
    store = getattr(services, "voices", None)
    report["device"] = _device(services, engine_health)
    report["engine"] = {
        "backend": engine.backend_name,
        "model": _model_name(services, engine_health),
        "state": engine_health.get("state"),
        "sample_rate": engine.sample_rate,
        "supports_cloning": bool(getattr(engine, "supports_cloning", False)),
        "live_requests": engine_health.get("live_requests"),
        "queue_depth": engine_health.get("queue_depth"),
        "max_pending_requests": engine.max_pending_requests,
        # engine worker processes (engine.workers / engine.remote): address, device, state, capacity,
        # in_flight each; empty with the engine in process
        "workers": engine_health.get("workers", []),
    }
    report["voices"] = {
        "default": engine.default_voice,
        "count": len(engine.voices),
        "names": engine.voices,
        "presets": store.names() if store is not None else [],
    }
    report["memory"] = health_memory(services, engine_health)
    return report


def _device(services: Services, engine_health: dict[str, Any]) -> str:
    device = engine_health.get("device") or getattr(services.engine, "device", None)
    if device:
        return str(device)
    if services.engine.backend_name == "cosyvoice":  # the model runs where tts.device put it
        configured = services.config.tts.device
        if configured == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return configured
    return "cpu"  # fake and espeak run on the CPU


def _model_name(services: Services, engine_health: dict[str, Any]) -> str:
    model = engine_health.get("model")
    if model:
        return str(model)
    if services.engine.backend_name == "cosyvoice":
        return Path(services.config.tts.model_dir).name
    return services.engine.backend_name  # fake / espeak: the backend is the model


def health_memory(services: Services, engine_health: dict[str, Any]) -> dict[str, Any]:
    """The memory budget and what is in use (also in GET /v1/status)."""
    gpu_config = getattr(services.config, "gpu", None)
    memory: dict[str, Any] = {
        "budget_gib": getattr(gpu_config, "memory_gib", None) or None,  # gpu.memory_gib; None: no cap
        "tts_budget_gib": getattr(gpu_config, "tts_memory_gib", None),
        "engine": engine_health.get("memory"),
        "process_rss_bytes": _rss_bytes(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info()
        memory["cuda"] = {
            "allocated_bytes": torch.cuda.memory_allocated(),
            "reserved_bytes": torch.cuda.memory_reserved(),
            "free_bytes": free,
            "total_bytes": total,
        }
    return memory


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
