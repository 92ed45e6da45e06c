"""Text that cannot be spoken is a 400 on every speech endpoint, against a real loopback server.

A lone UTF-16 surrogate (JSON ``"\\ud800"``) cannot be encoded for a tokenizer or espeak-ng (it was a
500 on CosyVoice); text with no letter or digit outside emoji (punctuation, emoji) used to give 200
with empty audio.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from tests.api_helpers import CloningFakeBackend, fake, prompt_wav
from tests.gateway_server import running_gateway

LONE_SURROGATE = "\ud800 hi"
NOTHING_TO_SAY = ["😊🎉👍🏽", "……。。。!?", "... --- ~~ **", "1️⃣ #️⃣"]

# path, the JSON field that holds the text
JSON_ENDPOINTS = [
    ("/v1/tts", "text"),
    ("/v1/tts/stream", "text"),
    ("/v1/audio/speech", "input"),
    ("/tts", "text"),
]


def raw_json(body: dict) -> bytes:
    """JSON as a client sends it: ``ensure_ascii`` writes a lone surrogate as the escape ``\\ud800``."""
    return json.dumps(body).encode("ascii")


async def post_json(client: httpx.AsyncClient, url: str, body: dict) -> httpx.Response:
    return await client.post(url, content=raw_json(body), headers={"content-type": "application/json"})


def assert_error(reply: httpx.Response, code: str, param: str, words: str) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == code and error["param"] == param
    assert words in error["message"]


@pytest.mark.parametrize(("path", "field"), JSON_ENDPOINTS)
async def test_lone_surrogate_is_a_400_on_every_json_endpoint(path, field):
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient(timeout=30) as client:
        reply = await post_json(client, gw.url + path, {field: LONE_SURROGATE})
        still_fine = await post_json(client, gw.url + path, {field: "hi"})
    assert_error(reply, "invalid_text", field, "lone surrogate U+D800 at position 0")
    assert still_fine.status_code == 200


@pytest.mark.parametrize(("path", "field"), JSON_ENDPOINTS)
async def test_text_with_nothing_to_speak_is_a_400_on_every_json_endpoint(path, field):
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient(timeout=30) as client:
        replies = [await post_json(client, gw.url + path, {field: text}) for text in NOTHING_TO_SAY]
    for reply in replies:
        assert_error(reply, "nothing_to_speak", field, "nothing to speak")


async def test_query_string_text_with_nothing_to_speak_is_a_400():
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient(timeout=30) as client:
        reply = await client.get(gw.url + "/v1/tts", params={"text": "😊。"})
    assert_error(reply, "nothing_to_speak", "text", "nothing to speak")


async def test_lone_surrogate_in_instructions_is_a_400():
    async with running_gateway(backend=CloningFakeBackend()) as gw, httpx.AsyncClient(timeout=30) as client:
        reply = await post_json(
            client, gw.url + "/v1/audio/speech", {"input": "hi", "instructions": "\udc00 calm"}
        )
    assert reply.status_code == 400
    assert "lone surrogate U+DC00" in reply.json()["error"]["message"]


async def test_zero_shot_text_with_nothing_to_speak_is_a_400():
    async with running_gateway(backend=CloningFakeBackend()) as gw, httpx.AsyncClient(timeout=30) as client:
        files = {"prompt_wav": ("prompt.wav", prompt_wav(), "audio/wav")}
        reply = await client.post(
            gw.url + "/tts/zero_shot", data={"text": "😊！", "prompt_text": "你好"}, files=files
        )
    assert_error(reply, "nothing_to_speak", "text", "nothing to speak")


async def test_ws_tts_answers_bad_text_with_an_error_and_stays_open():
    async with running_gateway(backend=fake()) as gw:
        url = gw.url.replace("http", "ws", 1) + "/ws/tts"
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"text": LONE_SURROGATE, "id": "bad"}))
            bad = json.loads(await asyncio.wait_for(ws.recv(), 10))
            await ws.send(json.dumps({"text": "😊……", "id": "empty"}))
            empty = json.loads(await asyncio.wait_for(ws.recv(), 10))
            await ws.send(json.dumps({"text": "你好", "id": "good"}))
            while (good := json.loads(await asyncio.wait_for(ws.recv(), 10)))["type"] == "audio_chunk":
                pass
    assert bad["type"] == "error" and bad["id"] == "bad" and bad["status"] == 400
    assert bad["code"] == "invalid_text" and "lone surrogate" in bad["message"]
    assert empty["type"] == "error" and empty["id"] == "empty" and empty["code"] == "nothing_to_speak"
    assert good["type"] == "done" and good["id"] == "good" and good["samples"] > 0
