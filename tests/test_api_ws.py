"""WS /ws/tts against a real loopback server."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from tests.api_helpers import RATE, dominant_hz, fake, slow, voice_hz, wait_until
from tests.gateway_server import running_gateway


def ws_url(gw, query: str = "") -> str:
    return gw.url.replace("http", "ws", 1) + "/ws/tts" + query


async def receive(ws, timeout: float = 10.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def until_end(ws, job_id: str) -> tuple[np.ndarray, dict]:
    """Audio of ``job_id`` and its final ``done``/``error`` message."""
    chunks: list[bytes] = []
    while True:
        message = await receive(ws)
        assert message["id"] == job_id, message
        if message["type"] == "audio_chunk":
            assert message["seq"] == len(chunks)
            chunks.append(base64.b64decode(message["data"]))
        else:
            return np.frombuffer(b"".join(chunks), dtype="<i2"), message


async def test_several_texts_on_one_connection_in_order():
    backend = fake(voices=("default", "bob"))
    async with running_gateway(backend=backend) as gw, websockets.connect(ws_url(gw)) as ws:
        await ws.send(json.dumps({"text": "你好", "id": "a"}))
        await ws.send(
            json.dumps({"type": "tts", "text": "今天天气很好", "voice": "bob", "sample_rate": 16000})
        )
        first, done_a = await until_end(ws, "a")
        second, done_b = await until_end(ws, "2")
    assert done_a == {"type": "done", "id": "a", "chunks": done_a["chunks"], "samples": first.size,
                      "duration_s": round(first.size / RATE, 3), "sample_rate": RATE, "aborted": False}  # fmt: skip
    assert first.size == backend.num_samples_for("你好") and done_a["chunks"] >= 1
    assert done_b["type"] == "done" and done_b["sample_rate"] == 16000 and not done_b["aborted"]
    assert abs(second.size / 16000 - backend.num_samples_for("今天天气很好") / RATE) < 0.01
    assert abs(dominant_hz(second, 16000) - voice_hz(backend, "bob")) < 3


async def test_first_chunk_arrives_while_the_engine_is_still_working():
    async with running_gateway(backend=slow()) as gw, websockets.connect(ws_url(gw)) as ws:
        await ws.send(json.dumps({"text": "一二三四五六七八九十" * 2, "id": "x"}))
        first = await receive(ws)
        live = gw.services.engine.stats["live"]
        messages = [first]
        while messages[-1]["type"] == "audio_chunk":
            messages.append(await receive(ws))
    assert first["type"] == "audio_chunk" and live == 1
    assert messages[-1]["type"] == "done" and messages[-1]["chunks"] == len(messages) - 1 == 8


async def test_abort_stops_the_current_text_drops_the_queue_and_keeps_the_connection():
    backend = slow()
    async with running_gateway(backend=backend) as gw, websockets.connect(ws_url(gw)) as ws:
        await ws.send(json.dumps({"text": "很长的一段话" * 10, "id": "long"}))
        await ws.send(json.dumps({"text": "排队的", "id": "queued"}))
        assert (await receive(ws))["type"] == "audio_chunk"
        await ws.send(json.dumps({"type": "abort"}))
        ends: dict[str, dict] = {}
        while len(ends) < 2:
            message = await receive(ws)
            if message["type"] != "audio_chunk":
                ends[message["id"]] = message
        await wait_until(lambda: gw.services.engine.stats["live"] == 0, timeout=3.0)
        await ws.send(json.dumps({"text": "再来", "id": "after"}))
        after, done_after = await until_end(ws, "after")
    assert ends["long"]["type"] == "done" and ends["long"]["aborted"] is True
    assert ends["queued"] == {**ends["queued"], "type": "done", "aborted": True, "chunks": 0}
    assert done_after["aborted"] is False and after.size == backend.num_samples_for("再来")


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("{nope", "bad_json"),
        ("[1, 2]", "bad_message"),
        (json.dumps({"text": "hi", "voice": "nobody", "id": "v"}), "unknown_voice"),
        (json.dumps({"text": "", "id": "e"}), "empty_text"),
        (json.dumps({"text": "hi", "speed": 10, "id": "s"}), "invalid_request"),
        (json.dumps({"text": "hi", "sample_rate": 1234, "id": "r"}), "unsupported_sample_rate"),
        (b"\x00\x01", "binary_message"),
    ],
)
async def test_bad_messages_get_an_error_and_the_connection_goes_on(message, code):
    backend = fake()
    async with running_gateway(backend=backend) as gw, websockets.connect(ws_url(gw)) as ws:
        await ws.send(message)
        error = await receive(ws)
        await ws.send(json.dumps({"text": "好", "id": "ok"}))
        audio, done = await until_end(ws, "ok")
    assert error["type"] == "error" and error["code"] == code and error["status"] == 400 and error["message"]
    assert done["type"] == "done" and audio.size == backend.num_samples_for("好")


async def test_failure_mid_text_ends_it_with_an_error():
    async with running_gateway(backend=fake(fail_on="BOOM", fail_after_chunks=1)) as gw:
        async with websockets.connect(ws_url(gw)) as ws:
            await ws.send(json.dumps({"text": "BOOM " * 10, "id": "f"}))
            _, end = await until_end(ws, "f")
    assert end["type"] == "error" and end["code"] == "synthesis_failed"


async def test_disconnect_mid_text_aborts_the_engine_request_at_once():
    backend = slow()
    async with running_gateway(backend=backend) as gw:
        async with websockets.connect(ws_url(gw)) as ws:
            await ws.send(json.dumps({"text": "很长的一段话" * 10}))
            assert (await receive(ws))["type"] == "audio_chunk"
        waited = await wait_until(lambda: gw.services.engine.stats["live"] == 0, timeout=3.0)
        aborted = gw.services.engine.stats["requests_aborted"]
    assert waited < 1.0 and aborted == 1


async def test_api_key_is_required_when_configured():
    async with running_gateway({"api": {"api_keys": ["k1"]}}, backend=fake()) as gw:
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(ws_url(gw)):
                pass
        with pytest.raises(InvalidStatus):
            async with websockets.connect(ws_url(gw), additional_headers={"Authorization": "Bearer nope"}):
                pass
        async with websockets.connect(ws_url(gw), additional_headers={"Authorization": "Bearer k1"}) as ws:
            await ws.send(json.dumps({"text": "好", "id": "h"}))
            _, by_header = await until_end(ws, "h")
        async with websockets.connect(ws_url(gw, "?api_key=k1")) as ws:
            await ws.send(json.dumps({"text": "好", "id": "q"}))
            _, by_query = await until_end(ws, "q")
    assert refused.value.response.status_code == 403
    assert by_header["type"] == by_query["type"] == "done"
