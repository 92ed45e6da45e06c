"""Conversation memory on the store, through real loopback gateways and a real PostgreSQL server.

Two gateways on one PostgreSQL: a device talks to gateway A, then to gateway B, and B remembers (with a
SQLite file each, as before the store, B does not). A PostgreSQL server stopped or frozen mid-way: the
device's next connection and turn complete without memory, within the store's bound; /v1/health says
why; forgetting a device answers 503; once the server is back, the device's memory is too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from scripts.device_sim import DeviceSimulator
from tests.api_helpers import fake
from tests.gateway_server import RunningGateway, running_gateway
from tests.postgres_server import PostgresServer
from tests.test_device_memory import RecordingLLM

FACT = "my name is Alice"
TIMEOUT_S = 1.0  # store.timeout_s and connect_timeout_s of these gateways
CLOSE_S = 2.0  # SQLAlchemy's close of a connection that stopped answering (tests/test_store_outage.py)
SLACK_S = 3.0  # a loaded 2-core machine


def _settings(url: str) -> dict[str, Any]:
    return {
        "session": {"memory": "local", "memory_path": "/nonexistent/memory.sqlite3"},
        "store": {"url": url, "timeout_s": TIMEOUT_S, "connect_timeout_s": TIMEOUT_S},
    }


async def _ask(gw: RunningGateway, device_id: str, text: str) -> float:
    """One connection of the device and one turn; its duration (hello to the reply's end)."""
    started = time.monotonic()
    async with DeviceSimulator(gw.url, device_id=device_id) as sim:
        await sim.connect()
        await sim.listen_start("auto")
        await sim.ask(text, timeout=30)
    elapsed = time.monotonic() - started
    await gw.call(gw.services.memory.settle())  # the exchange is written (or its failure logged)
    return elapsed


async def _memory_follows(url_a: str, url_b: str) -> bool:
    llm_a, llm_b = RecordingLLM(), RecordingLLM()
    async with (
        running_gateway(_settings(url_a), backend=fake(), llm=llm_a) as a,
        running_gateway(_settings(url_b), backend=fake(), llm=llm_b) as b,
    ):
        await _ask(a, "dev-a", FACT)
        await _ask(b, "dev-a", "what is my name?")
        await _ask(b, "dev-b", "what is my name?")  # another device does not see it
        assert not llm_b.knows_alice()
        return any("Alice" in m["content"] for m in llm_b.chats[0][:-1])


async def test_with_one_postgresql_a_device_memory_follows_it_to_another_gateway(postgres_url: str) -> None:
    assert await _memory_follows(postgres_url, postgres_url)


async def test_with_a_sqlite_file_each_the_other_gateway_does_not_remember(tmp_path: Path) -> None:
    assert not await _memory_follows(f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db")


async def _health(gw: RunningGateway) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=gw.url) as client:
        return (await client.get("/v1/health")).json()


async def _outage(server: PostgresServer, *, freeze: bool) -> None:
    llm = RecordingLLM()
    async with running_gateway(_settings(server.url()), backend=fake(), llm=llm) as gw:
        await _ask(gw, "dev-a", FACT)
        normal = await _ask(gw, "dev-a", "what is my name?")
        assert llm.knows_alice()
        assert (await _health(gw))["store"]["state"] == "ok"
        server.freeze() if freeze else server.stop()
        try:
            degraded = await _ask(gw, "dev-a", "what is my name?")
            assert not llm.knows_alice()  # the turn went on without memory
            assert degraded < normal + TIMEOUT_S + CLOSE_S + SLACK_S, (degraded, normal)
            health = await _health(gw)
            assert health["status"] == "degraded" and health["store"]["state"] == "unavailable"
            assert any("the store" in reason and "unavailable" in reason for reason in health["reasons"])
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                forget = await client.delete("/v1/devices/dev-a/memory")
            assert forget.status_code == 503 and forget.json()["error"]["code"] == "memory_store_error"
        finally:
            server.thaw() if freeze else server.start()
        await _ask(gw, "dev-a", "what is my name?")
        assert llm.knows_alice()  # the memory is back with the server
        assert (await _health(gw))["store"]["state"] == "ok"


async def test_a_stopped_postgresql_costs_a_device_its_memory_not_its_turn(
    own_postgres: PostgresServer,
) -> None:
    await _outage(own_postgres, freeze=False)


async def test_a_frozen_postgresql_costs_a_device_its_bound_not_a_hang(own_postgres: PostgresServer) -> None:
    await _outage(own_postgres, freeze=True)
