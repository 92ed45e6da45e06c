"""``GET /v1/status``: a small live snapshot for the web console (gateway/console.py) and dashboards.

Built from the shared services and the metrics registry, not by parsing ``/metrics``: the open
sessions, the engine's batching and queue, the memory budget and use (as ``/v1/health`` reports it),
turn counters and the first-audio latency of the turns of the last ``window_s`` seconds (with the
time each was measured, which the Prometheus histogram cannot tell). Needs an API key when keys are set.
"""

from __future__ import annotations

import statistics
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from gateway.api.auth import require_api_key
from gateway.api.health import health_memory
from gateway.services import Services

router = APIRouter(dependencies=[Depends(require_api_key)], tags=["health"])

MAX_WINDOW_S = 3600.0


@router.get("/v1/status")
async def status(
    request: Request, window_s: Annotated[float, Query(gt=0, le=MAX_WINDOW_S)] = 300.0
) -> JSONResponse:
    return JSONResponse(status_report(request.app.state.services, window_s))


def status_report(services: Services, window_s: float = 300.0) -> dict[str, Any]:
    now = time.time()
    engine = services.engine
    health = engine.health()
    batching = health.get("batching", {})
    metrics = services.metrics
    recent = [(t, s) for t, s in metrics.recent_first_audio if now - t <= window_s]
    latencies = [s for _, s in recent]
    return {
        "time": now,
        "sessions": {
            "active": len(services.sessions),
            "devices": [
                {"id": key, "mode": str(getattr(s.mode, "value", "")) or None}
                for key, s in list(services.sessions.items())
            ],
        },
        "engine": {
            "backend": engine.backend_name,
            "state": health.get("state"),
            "live_requests": health.get("live_requests"),
            "queue_depth": health.get("queue_depth"),
            "max_pending_requests": engine.max_pending_requests,
            "max_batch_size": batching.get("max_batch_size"),
            "running": batching.get("running"),
            "waiting": batching.get("waiting"),
            "last_batch_size": batching.get("last_batch_size"),
            "mean_batch_size": batching.get("mean_batch_size"),
            "requests_total": health.get("requests_total"),
        },
        "memory": health_memory(services, health),
        "turns": _by_label(metrics.turns_total, "kind"),
        "first_audio": {
            "window_s": window_s,
            "count": len(latencies),
            "median_s": statistics.median(latencies) if latencies else None,
            "max_s": max(latencies) if latencies else None,
            "recent": [[round(t, 3), round(s, 4)] for t, s in recent],
        },
    }


def _by_label(counter: Any, label: str) -> dict[str, float]:
    """A labelled counter's values by label, read through the public ``collect()``."""
    return {
        sample.labels[label]: sample.value
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and label in sample.labels
    }
