"""GET /v1/status (the console's status panel) and /console being public while the API needs a key."""

from __future__ import annotations

import httpx

from gateway.xiaozhi import TtsStart
from scripts.device_sim import DeviceSimulator
from tests.api_helpers import fake
from tests.gateway_server import running_gateway


async def test_status_counts_sessions_turns_and_first_audio():
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient() as client:
        before = (await client.get(f"{gw.url}/v1/status")).json()
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        t_query = await sim.detect("How are you?")
        await sim.next_event(TtsStart, timeout=10)
        during = (await client.get(f"{gw.url}/v1/status")).json()
        await sim.collect_turn(t_query, timeout=15)
        after = (await client.get(f"{gw.url}/v1/status")).json()
        await sim.close()
        bad_window = await client.get(f"{gw.url}/v1/status", params={"window_s": "0"})
    assert before["sessions"]["active"] == 0 and before["first_audio"]["count"] == 0
    assert during["sessions"]["active"] == 1 and during["sessions"]["devices"][0]["id"] == sim.device_id
    assert during["engine"]["backend"] == "fake" and during["engine"]["max_batch_size"] >= 1
    assert {"queue_depth", "last_batch_size", "mean_batch_size"} <= set(during["engine"])
    assert after["memory"]["process_rss_bytes"] > 10_000_000
    first_audio = after["first_audio"]
    assert first_audio["count"] == 1 and len(first_audio["recent"]) == 1
    t, seconds = first_audio["recent"][0]
    assert 0 < seconds < 5 and abs(t - after["time"]) < 30
    assert sum(after["turns"].values()) >= 1
    assert bad_window.status_code in (400, 422)


async def test_console_page_is_public_and_its_api_calls_need_the_key():
    api = {"api_keys": ["k1"]}
    async with running_gateway({"api": api}, backend=fake()) as gw, httpx.AsyncClient() as client:
        page = await client.get(f"{gw.url}/console")
        script = await client.get(f"{gw.url}/console/assets/main.js")
        missing = await client.get(f"{gw.url}/console/assets/nope.js")
        status_without = await client.get(f"{gw.url}/v1/status")
        status_with = await client.get(f"{gw.url}/v1/status", headers={"Authorization": "Bearer k1"})
        voices_without = await client.get(f"{gw.url}/v1/voices")
        lookalike = await client.get(f"{gw.url}/consoleX")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert 'src="/console/assets/main.js"' in page.text
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert missing.status_code == 404
    assert status_without.status_code == 401 and voices_without.status_code == 401
    assert status_with.status_code == 200 and status_with.json()["sessions"]["active"] == 0
    assert lookalike.status_code == 401  # only /console and /console/... are public
