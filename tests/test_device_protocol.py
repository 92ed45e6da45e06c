"""Loopback integration of the protocol checklist (items that need no ASR): OTA, hello, uplink, MCP, lifetime.

Real uvicorn on a free port, the device simulator over a real WebSocket, the
fake TTS backend (cheap, deterministic audio) unless a test needs otherwise.
The checklist's turns, abort and barge-in are in test_device_protocol_turns.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import numpy as np
import pytest
import websockets

from gateway.device.mcp_client import McpError
from gateway.xiaozhi import AudioIn, AudioOut, ServerHello, Stt, TtsStart, TtsStop
from scripts.device_sim import DeviceSimulator
from tests.device_loopback import connected, fake
from tests.gateway_server import running_gateway

# ---- OTA (checklist 1-4) -------------------------------------------------------


async def test_ota_reply_points_devices_at_the_websocket():
    async with running_gateway(backend=fake()) as gw:
        sim = DeviceSimulator(gw.url)
        t0 = time.monotonic()
        data = await sim.ota()
        assert time.monotonic() - t0 < 5
        async with httpx.AsyncClient() as client:
            odd = await client.post(f"{gw.url}/xiaozhi/ota/", content=b"not json at all")
            empty = await client.post(f"{gw.url}/xiaozhi/ota/", json={"application": 5})
            status = await client.get(f"{gw.url}/xiaozhi/ota/")
    ws = data["websocket"]
    assert ws["url"] == gw.ws_url and ws["token"] == "" and ws["version"] == 1
    assert "mqtt" not in data and "activation" not in data
    assert abs(data["server_time"]["timestamp"] - time.time() * 1000) < 60_000
    assert data["server_time"]["timezone_offset"] == 480
    assert data["firmware"] == {"version": "2.4.2", "url": ""}
    for reply in (odd, empty):
        assert reply.status_code == 200
        body = reply.json()
        assert "websocket" in body and "firmware" not in body and "mqtt" not in body
    assert status.status_code == 200 and "websocket" in status.text


# ---- handshake and hello (5-9) --------------------------------------------------------


async def test_upgrade_hello_and_other_paths():
    async with running_gateway(backend=fake()) as gw:
        for path in ("/xiaozhi/v1/", "/some/other/path"):
            sim = DeviceSimulator(gw.url, ws_url=gw.url.replace("http", "ws") + path)
            t0 = time.monotonic()
            hello = await sim.connect()
            assert time.monotonic() - t0 < 1.0
            assert isinstance(hello, ServerHello) and hello.session_id
            raw = next(r for r in sim.records if isinstance(r.event, ServerHello))
            assert raw.event.audio_params.sample_rate == 16000
            await sim.close()
        async with httpx.AsyncClient() as client:
            plain = await client.get(f"{gw.url}/xiaozhi/v1/")
        assert plain.status_code == 200


async def test_server_hello_json_and_minimal_client_hello():
    async with running_gateway(backend=fake()) as gw:
        async with websockets.connect(
            gw.ws_url, additional_headers={"device-id": "aa:bb", "protocol-version": "1"}
        ) as ws:
            await ws.send(json.dumps({"type": "hello"}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 1.0))
    assert reply["type"] == "hello" and reply["transport"] == "websocket"
    assert isinstance(reply["session_id"], str) and reply["session_id"]
    assert reply["audio_params"] == {
        "format": "opus",
        "sample_rate": 16000,
        "channels": 1,
        "frame_duration": 60,
    }


async def test_identity_from_query_string_and_auth():
    cfg = {
        "server": {"auth": {"enabled": True, "tokens": ["secret"], "allowed_devices": ["11:22:33:44:55:66"]}}
    }
    async with running_gateway(cfg, backend=fake()) as gw:
        data = await DeviceSimulator(gw.url).ota()
        assert data["websocket"]["token"] == ""  # not an admitted device; never the operators' token
        for sim in (
            DeviceSimulator(gw.url, token="wrong"),
            DeviceSimulator(gw.url),
            DeviceSimulator(gw.url, token="wrong", use_query_identity=True),
        ):
            with pytest.raises(websockets.InvalidStatus) as info:
                await sim.connect()
            assert info.value.response.status_code == 401
        ok = await connected(gw, token="secret")
        ok_query = await connected(gw, token="secret", use_query_identity=True)
        allowed = await connected(gw, device_id="11:22:33:44:55:66")
        assert len(gw.services.sessions) == 3
        for sim in (ok, ok_query, allowed):
            await sim.close()


# ---- uplink, robustness (13, 22, 31-32) ------------------------------------------------------


async def test_manual_mode_without_asr_answers_not_configured():
    async with running_gateway(backend=fake()) as gw:
        sim = await connected(gw)
        await sim.listen_start("manual")
        t = np.arange(16000, dtype=np.float32) / 16000
        await sim.send_speech((np.sin(2 * np.pi * 300 * t) * 8000).astype(np.int16))
        await sim.listen_stop()
        turn = await sim.collect_turn(time.monotonic(), timeout=10)
        # listen start resets the buffer: a stop right after it recognises nothing
        await sim.listen_start("manual")
        await sim.listen_stop()
        await asyncio.sleep(0.3)
        await sim.close()
    assert turn.sentences == [gw.services.config.asr.not_configured_reply]
    assert len(turn.frames) > 0
    assert not [r for r in sim.records if r.t > turn.records[-1].t and not isinstance(r.event, AudioOut)]


async def test_bad_frames_are_dropped_and_the_session_goes_on():
    async with running_gateway(backend=fake()) as gw:
        sim = await connected(gw, protocol_version=3)
        await sim.listen_start("auto")
        for junk in ["not json", "[1,2]", '{"no_type":1}', '{"type":5}', json.dumps({"type": "x" * 70000})]:
            await sim.send_raw(junk)
        await sim.send_raw(json.dumps({"type": "iot", "update": True, "descriptors": []}))
        await sim.send_raw(
            json.dumps({"type": "mcp", "payload": {"jsonrpc": "2.0", "method": "notifications/x"}})
        )
        await sim.send_raw(json.dumps({"type": "listen", "state": "bogus"}))
        await sim.send_raw(json.dumps({"type": "brand_new_type"}))
        for junk in [b"", b"\x00", b"\x00\x00\x00\x09abc", b"\x00\x00\x00\x01\xff"]:
            await sim.send_raw(junk)
        for size in (0, 1, 2, 3):  # DTX frames
            await sim.send(AudioIn(opus=b"\xf8\xff\xfe"[:size]))
        tone = (np.sin(np.arange(16000 * 3) * 0.05) * 5000).astype(np.int16)
        await sim.send_speech(tone)  # a wake-word style burst
        turn = await sim.ask("still there?")
        await sim.close()
    assert turn.stt == "still there?" and len(turn.frames) > 0


# ---- MCP (29, 30) ----------------------------------------------------------------------


async def test_mcp_initialize_and_paged_tools_list():
    tools = [
        {"name": f"self.tool{i}", "description": "t", "inputSchema": {"type": "object"}} for i in range(5)
    ]
    async with running_gateway(backend=fake()) as gw:
        sim = DeviceSimulator(gw.url, mcp_tools=tools, mcp_page_size=2)
        await sim.connect()
        session = next(iter(gw.services.sessions.values()))
        await gw.call(asyncio.wait_for(session.mcp.ready.wait(), 5))
        assert [t["name"] for t in session.mcp.tools] == [t["name"] for t in tools]
        with pytest.raises(McpError, match="Unknown tool: self.tool0"):
            await gw.call(session.mcp.call_tool("self.tool0", {"x": 1}))
        await sim.close()
    requests = sim.mcp_requests
    assert requests[0]["method"] == "initialize"
    assert [r["method"] for r in requests[1:4]] == ["tools/list"] * 3
    ids = [r["id"] for r in requests]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids)
    assert requests[2]["params"]["cursor"] == "self.tool2"


# ---- session lifetime (33-36) -------------------------------------------------------------


async def test_idle_session_is_closed_and_pings_do_not_count():
    async with running_gateway(
        {"session": {"idle_no_voice_s": 1.0, "idle_hard_s": 1.0}}, backend=fake()
    ) as gw:
        sim = DeviceSimulator(gw.url)
        t0 = time.monotonic()  # before the connect: the server's idle window starts at its accept
        await sim.connect()
        answered = 0
        # pings every 0.1 s until the server closes: if they counted as activity the session would
        # outlive the 3 s bound; the close may land mid-ping on a slow machine
        async with asyncio.timeout(3):
            with contextlib.suppress(websockets.ConnectionClosed):
                while not sim.closed.is_set():
                    await asyncio.wait_for(await sim._ws.ping(), 1)
                    answered += 1
                    await asyncio.sleep(0.1)
            await sim.closed.wait()
        elapsed = time.monotonic() - t0
        await sim.close()
    assert answered >= 3, answered  # pings went on (and were answered) inside the idle window
    assert 0.9 <= elapsed < 2.5, elapsed
    assert not [r for r in sim.records if not isinstance(r.event, ServerHello)]


async def test_reconnect_from_the_same_device_replaces_the_old_session():
    async with running_gateway(backend=fake()) as gw:
        first = await connected(gw, device_id="aa:aa:aa:aa:aa:aa")
        second = await connected(gw, device_id="aa:aa:aa:aa:aa:aa")
        await asyncio.wait_for(first.closed.wait(), 3)
        assert first.server_hello.session_id != second.server_hello.session_id
        assert len(gw.services.sessions) == 1
        turn = await second.ask("hi")
        await second.close()
    assert turn.stt == "hi"


async def test_exit_command_closes_the_session():
    async with running_gateway(backend=fake()) as gw:
        sim = await connected(gw)
        await sim.detect("退出")
        await asyncio.wait_for(sim.closed.wait(), 3)
        await sim.close()
    kinds = [type(r.event) for r in sim.records][1:]
    assert kinds == [Stt, TtsStart, TtsStop]


async def test_health_and_metrics():
    async with running_gateway(backend=fake()) as gw:
        sim = await connected(gw)
        await sim.ask("hi")
        async with httpx.AsyncClient() as client:
            health = (await client.get(f"{gw.url}/v1/health")).json()
            metrics = (await client.get(f"{gw.url}/metrics")).text
        await sim.close()
    assert health["status"] == "ok" and health["sessions"] == 1
    assert health["tts"]["backend"] == "fake"
    assert "xz_first_audio_seconds_count 1.0" in metrics
    assert "xz_sessions_active 1.0" in metrics
    assert "xz_engine_" in metrics


async def test_health_says_why_speech_recognition_is_off():
    async with running_gateway(backend=fake()) as gw:
        async with httpx.AsyncClient() as client:
            health = (await client.get(f"{gw.url}/v1/health")).json()
    assert health["asr"]["backend"] == "none"
    assert "not configured" in health["asr"]["warning"]
