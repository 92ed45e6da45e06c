"""GET /v1/health: the gateway summary plus device, engine, model, voices and memory."""

from __future__ import annotations

import httpx

from tests.api_helpers import fake
from tests.gateway_server import running_gateway


async def test_health_reports_engine_voices_and_memory():
    async with running_gateway(backend=fake(voices=("default", "bob"))) as gw, httpx.AsyncClient() as client:
        await client.post(f"{gw.url}/v1/tts", json={"text": "你好"})
        reply = await client.get(f"{gw.url}/v1/health")
    health = reply.json()
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    assert health["status"] == "ok" and health["sessions"] == 0
    assert health["tts"]["backend"] == "fake" and health["tts"]["warning"] is None
    assert health["device"] == "cpu"
    assert health["engine"] == {**health["engine"], "backend": "fake", "model": "fake", "state": "running",
                                "sample_rate": 24000, "supports_cloning": False, "live_requests": 0}  # fmt: skip
    # this request's, after the fixed phrases made at start-up (the greeting, apology, tool filler and
    # no-ASR notice: gateway/speech/phrases.py)
    assert health["phrases"]["stored"] == 4 and health["phrases"]["missing"] == []
    assert health["tts"]["stats"]["requests_finished"] == 1 + 4
    assert health["voices"] == {"default": "default", "count": 2, "names": ["default", "bob"], "presets": []}
    assert "budget_gib" in health["memory"] and health["memory"]["process_rss_bytes"] > 10_000_000
