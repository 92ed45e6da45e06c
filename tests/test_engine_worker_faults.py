"""Engine worker faults with real worker processes (issue 23): stalls, restarts, stale load reports.

- A worker frozen with SIGSTOP is noticed within its bound (``engine.worker_stall_timeout_s``): it is not
  ready, its sentences end with the apology, new turns hear the stored apology, HTTP answers 503 at once,
  ``/v1/health`` says ``unavailable`` (HTTP 503); still stuck, it is killed and restarted.
- A worker whose engine step hangs is stalled the same way, and ready again once the step ends.
- Turns while the only worker restarts hear the stored apology (they used to be silent), and restarts
  never stop: after ``worker_max_restarts`` the worker shows ``failed`` and still comes back.
- Aborted requests and dropped clients update the worker's in-flight count at the gateway at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from typing import Any

import httpx
import websockets

from gateway.llm.echo import EchoLLM
from gateway.xiaozhi import AudioOut, TtsSentenceStart
from scripts.device_sim import DeviceSimulator, Turn
from tests.gateway_server import RunningGateway, running_gateway
from tts_engine.worker.frames import Health

APOLOGY = "sorry, the speech engine had a problem."
STALL_S = 1.0  # the bound these tests run with (the default is 5 s: docs/engine-workers.md)


def overrides(workers: int = 1, **backend: Any) -> dict[str, Any]:
    return {
        "tts": {"backend": "fake", "text_normalization": "off"},
        "engine": {
            "workers": workers,
            "worker_backend_options": backend,
            "worker_start_timeout_s": 60,
            "worker_stall_timeout_s": STALL_S,
        },  # fmt: skip
        "llm": {"apology": APOLOGY},
    }


def slots(gw: RunningGateway) -> list[Any]:
    return gw.services.engine.slots  # type: ignore[union-attr]


async def device(gw: RunningGateway, index: int) -> DeviceSimulator:
    sim = DeviceSimulator(gw.url, device_id=f"aa:bb:cc:00:05:{index:02x}", protocol_version=1)
    await sim.connect()
    await sim.listen_start("auto")
    return sim


async def health(client: httpx.AsyncClient, gw: RunningGateway) -> tuple[int, dict[str, Any]]:
    reply = await client.get(f"{gw.url}/v1/health")
    return reply.status_code, reply.json()


async def until_health(client: httpx.AsyncClient, gw: RunningGateway, status: str, timeout: float) -> float:
    """Seconds until /v1/health reports ``status`` (asserts it does within ``timeout``)."""
    start = time.monotonic()
    async with asyncio.timeout(timeout):
        while (await health(client, gw))[1]["status"] != status:
            await asyncio.sleep(0.05)
    return time.monotonic() - start


def heard_why(turn: Turn) -> bool:
    """The turn spoke the apology: its sentence start and audio after it."""
    if APOLOGY not in turn.sentences:
        return False
    start = next(r.t for r in turn.records if getattr(r.event, "text", None) == APOLOGY)
    return any(r.t >= start for r in turn.frames)


async def test_a_stopped_worker_is_noticed_within_its_bound_and_restarted() -> None:
    llm = EchoLLM(prefix="", chinese_prefix="")
    options = overrides(ms_per_char=80.0, chunk_ms=200, compute_delay_s=0.05)
    async with running_gateway(options, llm=llm) as gw, httpx.AsyncClient(timeout=30) as client:
        slot = slots(gw)[0]
        pid = slot.process.pid
        sim = await device(gw, 1)
        try:
            t_query = await sim.detect("this long sentence keeps the only worker busy for a good while.")
            await sim.next_event(AudioOut, timeout=20)  # the reply is under way
            os.kill(pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            while (
                getattr((record := await sim.next_event(TtsSentenceStart, timeout=10)).event, "text", "")
                != APOLOGY
            ):
                pass
            assert record.t - stopped_at < STALL_S + 2.5  # a ping's phase, its 1 s bound and some slack
            status, body = await health(client, gw)  # stalled now (killed and restarted after 3 bounds)
            assert status == 503 and body["status"] == "unavailable" and "stalled" in body["reasons"][0]
            assert body["engine"]["workers"][0]["state"] == "stalled"
            rest = await sim.collect_turn(t_query, timeout=20)  # after the apology's sentence start
            assert rest.frames and rest.sentences == []  # its audio, and nothing of the reply after it
            started = time.monotonic()
            reply = await client.post(f"{gw.url}/v1/tts", json={"text": "anyone there?"})
            assert reply.status_code == 503 and reply.json()["error"]["code"] == "engine_unavailable"
            assert time.monotonic() - started < 1.0  # refused at once, not after the stall
            again = await sim.ask("and now?", timeout=10)  # a new turn hears why, from the stored audio
            assert heard_why(again) and again.sentences == [APOLOGY]
        finally:
            await sim.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # whatever the gateway did, leave nothing stopped behind

        await until_health(client, gw, "ok", timeout=30)  # killed after 3 bounds stuck, started again
        assert slot.process.pid != pid and slot.restarts == 1
        reply = await client.post(f"{gw.url}/v1/tts", json={"text": "back again."})
        assert reply.status_code == 200 and len(reply.content) > 1000


async def test_a_hung_engine_step_stalls_the_worker_until_it_ends() -> None:
    # the step of a text with HANG takes 2.5 s: over the 1 s bound for one and a half ping periods (1 s
    # each), so a ping sees it running whatever the pings' phase; a restart needs 3 s stalled after that
    options = overrides(ms_per_char=20.0, chunk_ms=100, hang_on="HANG", hang_s=2.5)
    async with running_gateway(options) as gw, httpx.AsyncClient(timeout=30) as client:
        slot = slots(gw)[0]
        pid = slot.process.pid
        started = time.monotonic()
        reply = await client.post(f"{gw.url}/v1/tts", json={"text": "HANG on a moment"})
        assert reply.status_code == 503 and "stalled" in reply.json()["error"]["message"]
        assert time.monotonic() - started < STALL_S + 2.0  # seen by the first ping past the bound
        assert (await health(client, gw))[0] == 503
        await until_health(client, gw, "ok", timeout=10)  # the step ended: ready again, not restarted
        assert slot.process.pid == pid and slot.restarts == 0
        reply = await client.post(f"{gw.url}/v1/tts", json={"text": "fine again"})
        assert reply.status_code == 200


async def test_turns_while_the_only_worker_restarts_hear_why_and_restarts_never_stop() -> None:
    llm = EchoLLM(prefix="", chinese_prefix="")
    options = overrides(ms_per_char=20.0, chunk_ms=100)
    options["engine"]["worker_max_restarts"] = 1
    async with running_gateway(options, llm=llm) as gw, httpx.AsyncClient(timeout=30) as client:
        slot = slots(gw)[0]
        sims = [await device(gw, i) for i in range(4)]
        try:
            for kill in range(3):  # past worker_max_restarts: it used to be given up for good
                os.kill(slot.process.pid, signal.SIGKILL)
                async with asyncio.timeout(10):
                    while slot.is_ready or slot.state == "ready":  # lost, then the supervisor's move
                        await asyncio.sleep(0.02)
                status, body = await health(client, gw)
                assert status == 503 and body["status"] == "unavailable" and body["reasons"]
                turns = await asyncio.gather(*(sim.ask(f"hello {kill}.", timeout=10) for sim in sims))
                for turn in turns:  # every turn says why (they used to be tts start + stop, silent)
                    assert heard_why(turn) and turn.sentences == [APOLOGY], turn.sentences
                if kill == 1:
                    assert body["engine"]["workers"][0]["state"] in ("failed", "starting")
                await until_health(client, gw, "ok", timeout=40)
            assert slot.restarts == 3
            turns = await asyncio.gather(*(sim.ask("all good now.", timeout=20) for sim in sims))
            assert all(turn.sentences == ["all good now."] for turn in turns)
        finally:
            for sim in sims:
                await sim.close()


async def test_health_says_unavailable_from_the_moment_the_only_worker_is_lost() -> None:
    # between the link's loss and the supervisor's next state, health used to read the old "ready": 200 ok
    async with running_gateway(overrides()) as gw, httpx.AsyncClient(timeout=30) as client:
        slot = slots(gw)[0]

        async def at_the_loss() -> dict[str, Any]:  # on the gateway's loop: the first tick the link is gone
            async with asyncio.timeout(10):
                while slot.is_ready:
                    await asyncio.sleep(0)
            return gw.services.health()

        watching = asyncio.ensure_future(gw.call(at_the_loss()))
        await asyncio.sleep(0.2)
        os.kill(slot.process.pid, signal.SIGKILL)
        report = await watching
        assert report["status"] == "unavailable", report["tts"]["workers"]
        assert report["tts"]["workers"][0]["state"] != "ready"
        status, body = await health(client, gw)
        assert status == 503 and body["status"] == "unavailable"


async def test_dropped_streams_update_the_in_flight_count_at_once() -> None:
    # 2 workers, 20 long /ws/tts streams (10 on each), 4 short requests, then every socket dropped
    options = overrides(workers=2, ms_per_char=40.0, chunk_ms=100, compute_delay_s=0.05)
    async with running_gateway(options) as gw, httpx.AsyncClient(timeout=30) as client:
        url = gw.url.replace("http", "ws", 1) + "/ws/tts"
        sockets = [await websockets.connect(url) for _ in range(20)]
        try:
            for index, ws in enumerate(sockets):
                await ws.send(json.dumps({"text": "a long text that takes its time. " * 8, "id": str(index)}))
            for ws in sockets:
                assert json.loads(await asyncio.wait_for(ws.recv(), 20))["type"] == "audio_chunk"
            replies = await asyncio.gather(
                *(client.post(f"{gw.url}/v1/tts", json={"text": "hi"}) for _ in range(4))
            )
            assert all(r.status_code == 200 for r in replies)
            workers = (await health(client, gw))[1]["engine"]["workers"]
            assert sum(w["worker_in_flight"] for w in workers) >= 18
        finally:
            for ws in sockets:
                await ws.close()
        dropped = time.monotonic()
        async with asyncio.timeout(5):
            while any(
                (w["worker_in_flight"] or 0) for w in (await health(client, gw))[1]["engine"]["workers"]
            ):
                await asyncio.sleep(0.05)
        assert time.monotonic() - dropped < 1.0  # the gateway's view converged within a second

        async def asked() -> list[int]:  # the workers' own count, asked directly
            return [(await slot.link.call(Health(call=0))).report.in_flight for slot in slots(gw)]

        assert await gw.call(asked()) == [0, 0]
        before = [slot.link.counts["requests_total"] for slot in slots(gw)]
        replies = await asyncio.gather(
            # distinct texts: a repeated one would be served by the audio cache, not by a worker
            *(client.post(f"{gw.url}/v1/tts", json={"text": f"hi {i}"}) for i in range(8))
        )
        served = [slot.link.counts["requests_total"] - b for slot, b in zip(slots(gw), before, strict=True)]
        assert all(r.status_code == 200 for r in replies)
    assert min(served) >= 3, served  # both take new work again (a stale count of 10 sent 7 of 8 to one)
