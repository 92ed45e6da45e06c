"""`python -m gateway devices|agents ...` (gateway/devices/cli.py) on a SQLite store the test prepares: lists,
shows (LLM keys masked), gives an agent, kicks, deletes; exit status 1 for what it refuses, 2 for a bad
config, 3 (within the store's bound) when the store is unavailable."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from gateway.__main__ import main
from gateway.agents.profile import AgentLLM, AgentProfile
from gateway.agents.store import AgentStore
from gateway.config import load_config
from gateway.devices.cli import CLI_SCHEMAS
from gateway.devices.registry import DeviceRegistry, DeviceReport
from gateway.store import Store

SECRET = "sk-cli-test-0123456789abcdEFGH"
DEVICE = "02:00:00:00:c1:01"


async def _prepare(url: str) -> None:
    store = Store(url, schemas=CLI_SCHEMAS)
    await store.open()
    try:
        await AgentStore(store).create(AgentProfile(name="kid", voice="cartoon",
                                                    llm=AgentLLM(provider="openai", api_key=SECRET)))  # fmt: skip
        registry = DeviceRegistry(store, load_config(environ={}).devices)
        await registry.seen(DeviceReport(DEVICE, board="esp-box-3", firmware="2.4.2"))
        await registry.aclose()
    finally:
        await store.close()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_cli_lists_shows_binds_kicks_and_deletes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    asyncio.run(_prepare(url))
    monkeypatch.setenv("XZ_STORE__URL", url)

    code, out, _ = _cli(capsys, "agents", "list", "--json")
    assert code == 0 and [a["name"] for a in json.loads(out)] == ["default", "kid"]
    code, out, _ = _cli(capsys, "agents", "show", "kid")
    assert code == 0 and json.loads(out)["llm"]["api_key"] == "****EFGH" and SECRET not in out
    assert _cli(capsys, "agents", "show", "ghost")[0] == 1

    code, out, _ = _cli(capsys, "devices", "list")
    assert code == 0 and DEVICE in out and "esp-box-3" in out and "default" in out
    code, out, _ = _cli(capsys, "devices", "agent", DEVICE.upper().replace(":", "-"), "kid")  # any MAC form
    assert code == 0 and "agent kid" in out
    code, out, _ = _cli(capsys, "devices", "show", DEVICE, "--json")
    assert code == 0 and json.loads(out)["agent"] == "kid" and json.loads(out)["state"] == "bound"
    code, _, err = _cli(capsys, "devices", "agent", DEVICE, "nobody")
    assert code == 1 and "nobody" in err
    code, _, err = _cli(capsys, "devices", "bind", "123456")
    assert code == 1 and "123456" in err
    assert _cli(capsys, "devices", "kick", DEVICE)[0] == 0
    assert _cli(capsys, "devices", "delete", DEVICE)[0] == 0
    assert _cli(capsys, "devices", "show", DEVICE)[0] == 1
    assert _cli(capsys, "devices", "delete", DEVICE)[0] == 1


def test_the_cli_says_why_it_cannot_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XZ_STORE__URL", "mysql://nowhere/db")
    code, _, err = _cli(capsys, "devices", "list")
    assert code == 2 and "store" in err
    # a PostgreSQL server that is not there: exit 3 within the store's bounds, no hang
    monkeypatch.setenv("XZ_STORE__URL", "postgresql://xz@127.0.0.1:9/nothing")
    monkeypatch.setenv("XZ_STORE__CONNECT_TIMEOUT_S", "1")
    monkeypatch.setenv("XZ_STORE__TIMEOUT_S", "1")
    monkeypatch.setenv("XZ_STORE__MIGRATE_TIMEOUT_S", "2")
    started = time.monotonic()
    code, _, err = _cli(capsys, "devices", "bind", "123456")
    assert code == 3 and "unavailable" in err.lower(), err
    assert time.monotonic() - started < 15
