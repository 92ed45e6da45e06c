"""Per-device memory over a real loopback gateway: a fact said in one session reaches the model after a
reconnect and after a server restart; devices are kept apart; `memory: none` keeps nothing; DELETE forgets."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from gateway.llm.memory import SUMMARY_PROMPT
from scripts.device_sim import DeviceSimulator
from tests.api_helpers import fake
from tests.gateway_server import running_gateway

FACT = "my name is Alice"
KEY = "memory-test-key"


class RecordingLLM:
    """Answers "OK." and records the messages of every chat (summaries apart)."""

    def __init__(self) -> None:
        self.chats: list[list[dict[str, str]]] = []
        self.summaries = 0

    async def stream_chat(self, messages: list[dict[str, str]]) -> AsyncIterator[str]:
        if messages[0]["content"] == SUMMARY_PROMPT:
            self.summaries += 1
            yield "The user is called Alice."
            return
        self.chats.append(messages)
        yield "OK."

    async def aclose(self) -> None:
        pass

    def knows_alice(self) -> bool:
        return any("Alice" in m["content"] for m in self.chats[-1][:-1])


def _settings(path: Path, memory: str = "local", **extra: Any) -> dict[str, Any]:
    """Memory in the store at ``path`` (a SQLite file that outlives a gateway's restart)."""
    return {
        "session": {
            "memory": memory,
            "memory_path": str(path.with_suffix(".legacy")),
            **extra.pop("session", {}),
        },
        "store": {"url": f"sqlite:///{path}"},
        **extra,
    }


def _stored_exchanges(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT COUNT(*) FROM memory_turns").fetchone()[0])


async def _ask(url: str, device_id: str, text: str) -> None:
    async with DeviceSimulator(url, device_id=device_id) as sim:
        await sim.connect()
        await sim.listen_start("auto")
        await sim.ask(text, timeout=15)


async def test_a_fact_is_remembered_after_a_reconnect_and_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    llm = RecordingLLM()
    async with running_gateway(_settings(path), backend=fake(), llm=llm) as gw:
        await _ask(gw.url, "dev-a", FACT)
        await _ask(gw.url, "dev-a", "what is my name?")  # a new connection of the same device
        assert llm.knows_alice()
        await _ask(gw.url, "dev-b", "what is my name?")  # another device does not see it
        assert not llm.knows_alice()
    restarted = RecordingLLM()
    async with running_gateway(_settings(path), backend=fake(), llm=restarted) as gw:
        await _ask(gw.url, "dev-a", "what is my name?")
        assert restarted.knows_alice()
        assert restarted.chats[-1][1] == {"role": "user", "content": FACT}


async def test_a_long_history_is_summarised_and_the_summary_is_restored(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    llm = RecordingLLM()
    async with running_gateway(
        _settings(path, session={"memory_max_messages": 4}), backend=fake(), llm=llm
    ) as gw:
        async with DeviceSimulator(gw.url, device_id="dev-a") as sim:
            await sim.connect()
            await sim.listen_start("auto")
            for text in (FACT, "one", "two", "three"):
                await sim.ask(text, timeout=15)
        await gw.call(gw.services.memory.settle())
        assert llm.summaries >= 1
        await _ask(gw.url, "dev-a", "what is my name?")
    system = llm.chats[-1][0]["content"]
    assert "The user is called Alice." in system
    assert all(m["content"] != FACT for m in llm.chats[-1])  # folded into the summary
    assert len(llm.chats[-1]) <= 1 + 4 + 1  # system, at most the limit, the question


async def test_memory_none_keeps_nothing(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    llm = RecordingLLM()
    async with running_gateway(_settings(path, memory="none"), backend=fake(), llm=llm) as gw:
        await _ask(gw.url, "dev-a", FACT)
        await _ask(gw.url, "dev-a", "what is my name?")
        assert not llm.knows_alice()
        async with httpx.AsyncClient(base_url=gw.url) as client:
            assert (await client.delete("/v1/devices/dev-a/memory")).status_code == 404
    assert _stored_exchanges(path) == 0


async def test_delete_forgets_a_device_and_needs_the_api_key(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    llm = RecordingLLM()
    settings = _settings(path, api={"api_keys": [KEY]})
    async with running_gateway(settings, backend=fake(), llm=llm) as gw:
        await _ask(gw.url, "dev-a", FACT)
        await _ask(gw.url, "dev-b", FACT)
        async with httpx.AsyncClient(base_url=gw.url) as client:
            assert (await client.delete("/v1/devices/dev-a/memory")).status_code == 401
            auth = {"Authorization": f"Bearer {KEY}"}
            assert (await client.delete("/v1/devices/dev-a/memory", headers=auth)).status_code == 204
            missing = await client.delete("/v1/devices/dev-a/memory", headers=auth)
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_device"
        await _ask(gw.url, "dev-a", "what is my name?")
        assert not llm.knows_alice()
        await _ask(gw.url, "dev-b", "what is my name?")
        assert llm.knows_alice()
