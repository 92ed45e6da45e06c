"""Loopback integration of a session's lifetime rules and its turn start/abort races.

Real uvicorn on a free port, the device simulator over a real WebSocket, the
fake TTS backend (its audio lasts 20 ms per character, so reply lengths are
known in advance).
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import warnings

import websockets

from gateway.xiaozhi import AudioIn, McpMessage, ServerHello, TtsStart, TtsStop
from scripts.device_sim import DeviceSimulator
from tests.gateway_server import running_gateway
from tts_engine.backends.fake import FakeBackend

MS_PER_CHAR = 20.0


class FixedLLM:
    """Answers every query with the same text, in one delta."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def stream_chat(self, messages):
        yield self.text


def reply_of(seconds: float) -> str:
    """A one-sentence reply whose speech lasts about `seconds` with the fake backend."""
    words = "la " * int(seconds * 1000 / MS_PER_CHAR / 3)
    return words.strip() + "."


def gateway(session: dict, reply_s: float):
    return running_gateway(
        {"session": session},
        backend=FakeBackend(ms_per_char=MS_PER_CHAR),
        llm=FixedLLM(reply_of(reply_s)),
    )


def only_session(gw):
    return next(iter(gw.services.sessions.values()))


# ---- item 8: the idle timers --------------------------------------------------------------


async def test_a_reply_longer_than_idle_no_voice_s_does_not_close_the_session():
    async with gateway({"idle_no_voice_s": 0.5, "idle_hard_s": 30}, reply_s=1.5) as gw:
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        t_query = await sim.detect("tell me something")
        turn = await sim.collect_turn(t_query, timeout=10)
        t_stop = turn.records[-1].t
        assert t_stop - t_query > 1.5  # the reply outlasted idle_no_voice_s
        await asyncio.wait_for(sim.closed.wait(), 5)
        closed_after = time.monotonic() - t_stop
        await sim.close()
    # the session outlived the reply and then closed idle_no_voice_s after it ended
    assert len(turn.frames) > 20
    assert 0.35 <= closed_after < 2.0, closed_after


async def test_idle_hard_s_caps_a_session_whatever_else_the_device_sends():
    """idle_hard_s counts from the user's last words and is not extended by replies,
    keepalives, silent audio or MCP traffic: a reply still playing is ended with `tts stop`."""
    async with gateway({"idle_no_voice_s": 0.6, "idle_hard_s": 1.0}, reply_s=4.0) as gw:
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("auto")
        t_query = await sim.detect("tell me a long story")
        while not sim.closed.is_set() and time.monotonic() - t_query < 6:
            try:
                await sim.send(AudioIn(opus=b"\xf8\xff\xfe"))  # silence (DTX)
                await sim.send_raw(
                    json.dumps({"type": "mcp", "payload": {"jsonrpc": "2.0", "method": "notifications/x"}})
                )
            except websockets.ConnectionClosed:
                break  # the server's close frame came in between the check and the send
            await asyncio.sleep(0.05)
        await asyncio.wait_for(sim.closed.wait(), 1)
        closed_after = time.monotonic() - t_query
        await sim.close()
    assert 0.9 <= closed_after < 2.5, closed_after
    kinds = [type(r.event) for r in sim.records if isinstance(r.event, TtsStart | TtsStop)]
    assert kinds == [TtsStart, TtsStop]  # the cut reply still ended with its tts stop


async def test_idle_watchdog_sleeps_through_a_long_turn():
    """No polling: during a 2 s turn past the no-voice deadline the watchdog wakes only a few times."""
    async with gateway({"idle_no_voice_s": 0.5, "idle_hard_s": 30}, reply_s=2.0) as gw:
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        session = only_session(gw)
        t_query = await sim.detect("tell me something")
        await sim.next_event(TtsStart, timeout=5)
        before = session.watchdog_wakeups
        turn = await sim.collect_turn(t_query, timeout=10)
        during = session.watchdog_wakeups - before
        await asyncio.wait_for(sim.closed.wait(), 5)
        await sim.close()
    assert turn.records[-1].t - t_query > 2.0
    assert during <= 3, during


# ---- item 11: detect then abort at once -----------------------------------------------------


async def test_detect_then_abort_at_once_leaves_no_unawaited_coroutine_and_answers_each_abort():
    async with gateway({"idle_no_voice_s": 30, "idle_hard_s": 30}, reply_s=1.0) as gw:
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        detect = json.dumps({"session_id": sim.server_hello.session_id, "type": "listen", "state": "detect"})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(20):
                query = json.dumps({**json.loads(detect), "text": f"question {i}"})
                abort = json.dumps({"session_id": sim.server_hello.session_id, "type": "abort"})
                await sim.send_raw(query)
                await sim.send_raw(abort)  # back to back: usually read before the turn task ran once
                await sim.next_event(TtsStop, timeout=5)
            await asyncio.sleep(0.3)
            await gw.call(asyncio.to_thread(gc.collect))
            gc.collect()
            turn = await sim.ask("still there?")
        await sim.close()
    unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert not unawaited
    assert turn.stt == "still there?" and len(turn.frames) > 0
    # every abort got exactly one tts stop, whether or not its turn had started speaking
    stops_before_last = [r for r in sim.records if isinstance(r.event, TtsStop) and r.t < turn.t_query]
    assert len(stops_before_last) == 20


# ---- item 13: MCP initialize ----------------------------------------------------------------


def initialize_index(sim: DeviceSimulator) -> int:
    return next(
        i
        for i, r in enumerate(sim.records)
        if isinstance(r.event, McpMessage) and r.event.payload.get("method") == "initialize"
    )


async def wait_for_initialize(sim: DeviceSimulator) -> dict:
    for _ in range(100):
        if any(r.get("method") == "initialize" for r in sim.mcp_requests):
            return next(r for r in sim.mcp_requests if r.get("method") == "initialize")
        await asyncio.sleep(0.02)
    raise AssertionError("no MCP initialize")


async def test_mcp_initialize_follows_the_hello_reply_and_offers_vision():
    url = "http://192.0.2.7:8000/mcp/vision/explain"
    async with running_gateway({"session": {"vision_url": url}}, backend=FakeBackend()) as gw:
        sim = DeviceSimulator(gw.url, mcp_tools=[])
        await sim.connect()
        init = await wait_for_initialize(sim)
        await sim.close()
    hello_at = next(i for i, r in enumerate(sim.records) if isinstance(r.event, ServerHello))
    assert hello_at < initialize_index(sim)
    # xiaozhi-sdk and the firmware read params.capabilities.vision {url, token}
    vision = init["params"]["capabilities"]["vision"]
    assert vision["url"] == url
    assert isinstance(vision["token"], str)


async def test_mcp_initialize_always_carries_vision_even_when_none_is_configured():
    async with running_gateway(backend=FakeBackend()) as gw:
        sim = DeviceSimulator(gw.url, mcp_tools=[])
        await sim.connect()
        init = await wait_for_initialize(sim)
        await sim.close()
    assert init["params"]["capabilities"]["vision"] == {"url": "", "token": ""}
