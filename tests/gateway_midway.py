"""A real gateway process (uvicorn, the app, its store) that stops inside the transaction of an agent edit or
of a binding by code, to be killed there (kill -9) by tests/test_devices_kill.py.

    python -m tests.gateway_midway STORE_URL edit   # creates agent "kid" (version 1), then PATCHes its voice:
                                                    # stops after the edit's revision row, before its agent row
    python -m tests.gateway_midway STORE_URL bind   # a device gets a code at OTA, then POST /v1/activations:
                                                    # stops after the code is marked bound, before the device row

Prints "ready <code or version>" before the request and "mid <what>" when stopped (the transaction open; the
gateway's loop blocked on stdin), flushed, one a line. The pause is a wrapper around SQLAlchemy's
``update()`` as gateway/agents/store.py and gateway/devices/registry.py call it, for the one table.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httpx

import gateway.agents.store as agent_store
import gateway.devices.registry as registry
from gateway.agents.store import agents_agents
from gateway.devices.tables import devices_devices
from tests.gateway_server import running_gateway
from tts_engine.backends.fake import FakeBackend

DEVICE = "02:00:00:00:99:01"


def _say(line: str) -> None:
    print(line, flush=True)


def _pause_at(module: Any, table: Any, what: str) -> None:
    real = module.update

    def pausing(target: Any, *args: Any, **kwargs: Any) -> Any:
        if target is table:
            _say(f"mid {what}")
            sys.stdin.readline()  # blocks the gateway's loop, its transaction open, until killed
            raise SystemExit("not killed")
        return real(target, *args, **kwargs)

    module.update = pausing


async def main(url: str, mode: str) -> None:
    cfg = {"store": {"url": url}, "ota": {"activation": "code"}, "session": {"enable_greeting": False}}
    backend = FakeBackend(voices=("default", "cartoon", "calm"))
    async with running_gateway(cfg, backend=backend) as gw, httpx.AsyncClient(timeout=60) as client:
        made = await client.post(f"{gw.url}/v1/agents", json={"name": "kid", "voice": "cartoon"})
        assert made.status_code == 201, made.text
        if mode == "edit":
            _say(f"ready {made.json()['version']}")
            _pause_at(agent_store, agents_agents, "edit")
            await client.patch(f"{gw.url}/v1/agents/kid", json={"voice": "calm", "version": 1})
        else:
            headers = {"Device-Id": DEVICE, "Client-Id": "c-99"}
            ota = await client.post(f"{gw.url}/xiaozhi/ota/", json={}, headers=headers)
            code = ota.json()["activation"]["code"]
            _say(f"ready {code}")
            _pause_at(registry, devices_devices, "bind")
            await client.post(f"{gw.url}/v1/activations", json={"code": code, "agent": "kid"})
        _say("not stopped")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
