"""A gateway killed (kill -9) in the middle of an agent edit or of a binding by code leaves the store
consistent, on both engines (SQLite file, a real PostgreSQL server): the edit is whole or absent (the agent
row and its revision agree), the binding is whole or absent (the code is still waiting and binds its device
afterwards). The gateway is a real process (tests/gateway_midway.py) stopped inside the transaction."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from gateway.agents.store import AGENTS_SCHEMA, AgentStore, agents_agents, agents_revisions
from gateway.config import load_config
from gateway.devices.registry import DeviceRegistry
from gateway.devices.tables import DEVICES_SCHEMA, devices_codes, devices_devices
from gateway.llm.memory_store import MEMORY_SCHEMA
from gateway.store import Store
from tests.gateway_midway import DEVICE

ROOT = Path(__file__).resolve().parent.parent


def _stopped_midway(url: str, mode: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.gateway_midway", url, mode], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:  # bounded: it reaches "mid" or exits (EOF)
        lines.append(line.strip())
        if line.startswith("mid"):
            break
    return proc, lines


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


async def _opened(url: str) -> Store:
    store = Store(url, schemas=[MEMORY_SCHEMA, AGENTS_SCHEMA, DEVICES_SCHEMA], timeout_s=10)
    await store.open()
    return store


async def test_a_kill_9_inside_an_agent_edit_leaves_the_agent_whole(store_url: str) -> None:
    proc, lines = await asyncio.to_thread(_stopped_midway, store_url, "edit")
    assert lines[-2:] == ["ready 1", "mid edit"], lines
    _kill(proc)
    store = await _opened(store_url)
    try:
        async with store.write() as conn:  # the killed gateway's locks are gone: this does not wait
            agent = (await conn.execute(select(agents_agents.c.version, agents_agents.c.profile))).one()
            revisions = (await conn.execute(select(agents_revisions.c.version, agents_revisions.c.profile)
                                            .order_by(agents_revisions.c.version))).all()  # fmt: skip
        assert agent.version == 1 and '"cartoon"' in agent.profile  # the edit left nothing
        assert [tuple(r) for r in revisions] == [(1, agent.profile)]
        agents = AgentStore(store)
        current = await agents.get("kid")
        assert current is not None and current.profile.voice == "cartoon"
        edited = await agents.update(current.profile.model_copy(update={"voice": "calm"}), expected_version=1)
        assert edited.version == 2  # the agent edits on
    finally:
        await store.close()


async def test_a_kill_9_inside_a_binding_leaves_the_code_waiting(store_url: str) -> None:
    proc, lines = await asyncio.to_thread(_stopped_midway, store_url, "bind")
    assert lines[-1] == "mid bind" and lines[-2].startswith("ready "), lines
    code = lines[-2].split()[1]
    _kill(proc)
    store = await _opened(store_url)
    try:
        async with store.write() as conn:
            bound_at = (await conn.execute(select(devices_codes.c.bound_at)
                                           .where(devices_codes.c.code == code))).scalar_one()  # fmt: skip
            device = (await conn.execute(select(devices_devices.c.state, devices_devices.c.agent)
                                         .where(devices_devices.c.device_id == DEVICE))).one()  # fmt: skip
        assert bound_at is None and tuple(device) == ("seen", None)  # neither half of the binding
        config = load_config(environ={}, overrides={"store": {"url": store_url}})
        registry = DeviceRegistry(store, config.devices)
        record = await registry.bind(code, "kid")  # the code still binds its device, once
        assert (record.device_id, record.state, record.agent) == (DEVICE, "bound", "kid")
        await registry.aclose()
    finally:
        await store.close()
