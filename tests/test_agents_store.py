"""Agents and devices on a shared, and a failing, store, through real loopback gateways and a real
PostgreSQL server: a device bound on one gateway talks with its agent on another, and an edit made on that
other gateway applies on the first from the device's next turn; with the server stopped the management API
answers 503 at once and a device's turn goes on with the default agent within the store's bound; once the
server is back, so is the device's agent."""

from __future__ import annotations

import time
from typing import Any

import httpx

from scripts.device_sim import DeviceSimulator
from tests.gateway_server import RunningGateway, running_gateway
from tests.postgres_server import PostgresServer
from tests.test_agents import InstructBackend

TIMEOUT_S = 1.0  # store.timeout_s and connect_timeout_s of these gateways
CLOSE_S = 2.0  # SQLAlchemy's close of a connection that stopped answering (tests/test_store_outage.py)
SLACK_S = 3.0  # a loaded 2-core machine
DEVICE = "02:00:00:00:a9:01"


def _settings(url: str) -> dict[str, Any]:
    return {
        "session": {"enable_greeting": False},
        "store": {"url": url, "timeout_s": TIMEOUT_S, "connect_timeout_s": TIMEOUT_S},
        "devices": {"lookup_timeout_s": TIMEOUT_S},
    }


async def _api(gw: RunningGateway, method: str, path: str, body: Any = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.request(method, f"{gw.url}{path}", json=body)


async def _turn_voice(gw: RunningGateway, backend: InstructBackend, text: str) -> tuple[str, float]:
    """One connection of the device and one turn (the echo LLM repeats `text`): its voice and duration."""
    started = time.monotonic()
    async with DeviceSimulator(gw.url, device_id=DEVICE) as sim:
        await sim.connect()
        await sim.listen_start("auto")
        turn = await sim.ask(text, timeout=30)
    elapsed = time.monotonic() - started
    assert any(text in s for s in turn.sentences), turn.sentences
    return next(v for t, v, _, _ in reversed(backend.spoken) if text in t), elapsed


async def test_with_one_postgresql_a_devices_agent_follows_it_to_another_gateway(postgres_url: str) -> None:
    backend_a, backend_b = InstructBackend(), InstructBackend()
    async with (
        running_gateway(_settings(postgres_url), backend=backend_a) as a,
        running_gateway(_settings(postgres_url), backend=backend_b) as b,
    ):
        assert (await _api(a, "POST", "/v1/agents", {"name": "kid", "voice": "cartoon"})).status_code == 201
        await DeviceSimulator(a.url, device_id=DEVICE).ota()
        await a.call(a.services.devices.settle())
        assert (await _api(a, "PATCH", f"/v1/devices/{DEVICE}", {"agent": "kid"})).status_code == 200
        assert (await _turn_voice(b, backend_b, "在B上"))[0] == "cartoon"  # bound on A, served by B
        edit = await _api(b, "PATCH", "/v1/agents/kid", {"voice": "calm"})  # edited on B
        assert edit.status_code == 200, edit.text
        assert (await _turn_voice(a, backend_a, "回到A"))[0] == "calm"  # applies on A
        listed = (await _api(b, "GET", "/v1/devices")).json()["data"]
        assert [(d["device_id"], d["agent"]) for d in listed] == [(DEVICE, "kid")]


async def test_a_stopped_postgresql_gives_503s_and_turns_with_the_default_agent(
    own_postgres: PostgresServer,
) -> None:
    backend = InstructBackend()
    async with running_gateway(_settings(own_postgres.url()), backend=backend) as gw:
        assert (await _api(gw, "POST", "/v1/agents", {"name": "kid", "voice": "cartoon"})).status_code == 201
        await DeviceSimulator(gw.url, device_id=DEVICE).ota()
        await gw.call(gw.services.devices.settle())
        assert (await _api(gw, "PATCH", f"/v1/devices/{DEVICE}", {"agent": "kid"})).status_code == 200
        voice, normal = await _turn_voice(gw, backend, "正常")
        assert voice == "cartoon"
        own_postgres.stop()
        try:
            voice, degraded = await _turn_voice(gw, backend, "停了")
            assert voice == "default"  # the default agent while the store cannot say
            assert degraded < normal + 2 * (TIMEOUT_S + CLOSE_S) + SLACK_S, (degraded, normal)
            for method, path, body in (
                ("GET", "/v1/agents", None), ("GET", "/v1/devices", None),
                ("PATCH", "/v1/agents/kid", {"voice": "calm"}),
                ("POST", "/v1/activations", {"code": "123456"}),
                ("PATCH", f"/v1/devices/{DEVICE}", {"agent": None}),
            ):  # fmt: skip
                started = time.monotonic()
                reply = await _api(gw, method, path, body)
                assert reply.status_code == 503, (path, reply.text)
                assert reply.json()["error"]["code"] == "store_unavailable"
                assert time.monotonic() - started < TIMEOUT_S + CLOSE_S + SLACK_S
        finally:
            own_postgres.start()
        for _ in range(3):  # the first turns after the restart may still find the store marked down
            voice, _ = await _turn_voice(gw, backend, "回来了")
            if voice == "cartoon":
                break
        assert voice == "cartoon"
