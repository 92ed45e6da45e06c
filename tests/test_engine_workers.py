"""The engine in 2 worker processes behind one gateway: routing, a SIGKILLed worker, its restart.

``python -m gateway serve``'s path (``engine.workers: 2``): the gateway starts two
``python -m tts_engine serve`` processes (fake backend) on unix sockets and connects to them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx

from gateway.llm.echo import EchoLLM
from scripts.device_sim import DeviceSimulator, Turn
from tests.gateway_server import RunningGateway, running_gateway

NUM_SESSIONS = 16
APOLOGY = "sorry, something went wrong."


def overrides(**backend_options: Any) -> dict[str, Any]:
    return {
        "tts": {"backend": "fake", "text_normalization": "off"},
        "engine": {"workers": 2, "worker_backend_options": backend_options, "worker_start_timeout_s": 60},
        "llm": {"apology": APOLOGY},
    }


async def one_turn(url: str, index: int, text: str) -> Turn:
    sim = DeviceSimulator(url, device_id=f"aa:bb:cc:00:01:{index:02x}", protocol_version=1)
    await sim.connect()
    try:
        await sim.listen_start("auto")
        return await sim.ask(text, timeout=60)
    finally:
        await sim.close()


async def speech(client: httpx.AsyncClient, url: str, text: str) -> httpx.Response:
    return await client.post(f"{url}/v1/tts", json={"text": text, "format": "pcm", "sample_rate": 16000})


async def started(client: httpx.AsyncClient, gw: RunningGateway) -> None:
    """Wait out the gateway's start-up (its workers' model load): the first request queues until then."""
    reply = await client.get(f"{gw.url}/v1/health")
    assert [w["state"] for w in reply.json()["engine"]["workers"]] == ["ready", "ready"]


def slots(gw: RunningGateway) -> list[Any]:
    return gw.services.engine.slots  # type: ignore[union-attr]


async def test_two_workers_serve_sixteen_sessions_and_api_clients() -> None:
    llm = EchoLLM(prefix="", chinese_prefix="")
    async with (
        running_gateway(overrides(ms_per_char=20.0), llm=llm) as gw,
        httpx.AsyncClient(timeout=60) as client,
    ):
        await started(client, gw)
        texts = [f"hello number {i}." for i in range(NUM_SESSIONS)]
        async with asyncio.timeout(90):
            turns, replies = await asyncio.gather(
                asyncio.gather(*(one_turn(gw.url, i, t) for i, t in enumerate(texts))),
                asyncio.gather(*(speech(client, gw.url, f"api text {i}") for i in range(4))),
            )
        health = (await client.get(f"{gw.url}/v1/health")).json()
        served = [slot.link.counts["requests_total"] for slot in slots(gw)]
    for text, turn in zip(texts, turns, strict=True):
        assert turn.sentences == [text]
        assert turn.audio.size > 0.5 * 16000 * len(text) * 0.020  # the whole sentence (Opus frames pad it)
    assert all(r.status_code == 200 and len(r.content) > 1000 for r in replies)
    workers = health["engine"]["workers"]
    assert [w["state"] for w in workers] == ["ready", "ready"]
    assert all(
        w["address"].startswith("unix:") and w["device"] == "cpu" and w["capacity"] >= 1 for w in workers
    )
    assert all(count >= 4 for count in served), served  # both workers took a share


async def test_requests_one_at_a_time_take_the_idle_workers_in_turn() -> None:
    # never two in flight: every pick is a tie between idle workers (it used to be the first one each time)
    async with running_gateway(overrides()) as gw, httpx.AsyncClient(timeout=60) as client:
        await started(client, gw)
        before = [slot.link.counts["requests_total"] for slot in slots(gw)]
        for i in range(8):
            assert (await speech(client, gw.url, f"one at a time {i}")).status_code == 200
        served = [slot.link.counts["requests_total"] - n for slot, n in zip(slots(gw), before, strict=True)]
    assert served == [4, 4], served


async def test_a_killed_worker_fails_only_its_sentences_and_comes_back() -> None:
    # 200 ms chunks that take 100 ms each: a 40-character sentence (3.2 s) is in flight for ~1.6 s
    llm = EchoLLM(prefix="", chinese_prefix="")
    options = overrides(ms_per_char=80.0, chunk_ms=200, compute_delay_s=0.1)
    options["engine"]["worker_max_restarts"] = 3
    async with running_gateway(options, llm=llm) as gw, httpx.AsyncClient(timeout=60) as client:
        await started(client, gw)
        text = "this sentence takes a while to speak ok."
        tasks = [asyncio.create_task(one_turn(gw.url, i, text)) for i in range(6)]
        victim = slots(gw)[0]
        deadline = time.monotonic() + 30
        while len(victim.link.streams) < 2 and time.monotonic() < deadline:  # its sentences are under way
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        in_flight = len(victim.link.streams)
        os.kill(victim.process.pid, signal.SIGKILL)
        async with asyncio.timeout(60):
            turns = await asyncio.gather(*tasks)

        apologised = [t for t in turns if APOLOGY in t.sentences]
        untouched = [t for t in turns if t.sentences == [text]]
        assert len(apologised) == in_flight >= 2  # each of its sessions: a failed sentence, then sorry
        assert len(untouched) == len(turns) - in_flight
        for turn in untouched:  # the other worker's sessions got all of theirs
            assert turn.audio.size >= 16000 * 3.0

        async with asyncio.timeout(30):  # the gateway restarts it
            while True:
                workers = (await client.get(f"{gw.url}/v1/health")).json()["engine"]["workers"]
                if workers[0]["state"] == "ready" and workers[0]["restarts"] == 1:
                    break
                await asyncio.sleep(0.1)
        async with asyncio.timeout(60):
            replies = await asyncio.gather(*(speech(client, gw.url, f"after {i}") for i in range(4)))
        assert all(r.status_code == 200 for r in replies)
        assert victim.link.counts["requests_total"] >= 1  # the new worker takes work again


async def test_no_worker_ready_is_a_503_not_a_hang() -> None:
    async with running_gateway(overrides(ms_per_char=20.0)) as gw, httpx.AsyncClient(timeout=60) as client:
        await started(client, gw)
        for slot in slots(gw):
            slot.max_restarts = 0  # stay down
            os.kill(slot.process.pid, signal.SIGKILL)
        async with asyncio.timeout(20):
            while any(slot.link is not None for slot in slots(gw)):
                await asyncio.sleep(0.05)
        reply = await speech(client, gw.url, "anyone there")
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "engine_unavailable"
