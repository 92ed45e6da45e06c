"""Requests shaped exactly as xiaozhi-esp32-server's `openai`, `custom` and `index_stream` TTS providers send them.

See /work/shared/docs/incumbent-tts-providers.md. `openai` and `custom` use `requests` (JSON from
`json.dumps`, so non-ASCII arrives as \\uXXXX; GET parameters with booleans as `True`/`False`, lists as
repeated keys, None dropped), read the whole body and decode it with pydub, which takes a WAV data size
literally. `index_stream` uses aiohttp with `json=`, reads the body in pieces and cuts 2880-byte frames
of 24 kHz s16le mono PCM.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np

from audio_codecs.formats import decode_audio
from tests.api_helpers import RATE, dominant_hz, fake, read_wav_literally, slow, voice_hz
from tests.gateway_server import running_gateway

SEGMENT = "今天是晴天"  # the incumbent strips the trailing punctuation of each segment
REQUESTS_HEADERS = {
    "User-Agent": "python-requests/2.32.3",
    "Accept-Encoding": "gzip, deflate",
    "Accept": "*/*",
    "Connection": "keep-alive",
}


async def requests_post_json(url: str, data: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    """`requests.post(url, json=data, headers=headers)`, byte for byte."""
    body = json.dumps(data).encode()  # requests: complexjson.dumps(json, allow_nan=False), ASCII escapes
    sent = {**REQUESTS_HEADERS, "Content-Type": "application/json", **headers}
    async with httpx.AsyncClient(timeout=None) as client:  # the incumbent sets no timeout
        return await client.post(url, content=body, headers=sent)


async def requests_get(url: str, params: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    """`requests.get(url, params=params, headers=headers)`."""
    flat = {
        k: [str(x) for x in v] if isinstance(v, list) else str(v) for k, v in params.items() if v is not None
    }
    async with httpx.AsyncClient(timeout=None) as client:
        return await client.get(
            f"{url}?{urlencode(flat, doseq=True)}", headers={**REQUESTS_HEADERS, **headers}
        )


def fill(params: dict[str, Any], text: str) -> dict[str, Any]:
    """The `custom` provider's `{prompt_text}` substitution (top-level strings only)."""
    return {k: v.replace("{prompt_text}", text) if isinstance(v, str) else v for k, v in params.items()}


# ---- openai ---------------------------------------------------------------------------------------


async def test_openai_provider_code_defaults_with_an_api_key():
    backend = fake()
    async with running_gateway({"api": {"api_keys": ["local-dummy-key"]}}, backend=backend) as gw:
        url = f"{gw.url}/v1/audio/speech"  # api_url, posted as-is
        data = {"model": "tts-1", "input": SEGMENT, "voice": "alloy", "response_format": "wav", "speed": 1.0}
        reply = await requests_post_json(url, data, {"Authorization": "Bearer local-dummy-key"})
        wrong_key = await requests_post_json(url, data, {"Authorization": "Bearer wrong-key"})
    assert reply.status_code == 200
    pcm, rate = read_wav_literally(reply.content)  # data size as written: correct sizes or silence
    assert rate == RATE and pcm.size == backend.num_samples_for(SEGMENT)
    assert wrong_key.status_code == 401


async def test_openai_provider_shipped_config_and_the_doc_example():
    backend = fake(voices=("default", "bob"))
    async with running_gateway(backend=backend) as gw:
        url = f"{gw.url}/v1/audio/speech"
        shipped = {"model": "tts-1", "input": SEGMENT, "voice": "onyx", "response_format": "wav", "speed": 1}
        ours = {"model": "cosyvoice", "input": SEGMENT, "voice": "bob", "response_format": "wav", "speed": 1}
        replies = [
            await requests_post_json(url, data, {"Authorization": "Bearer sk-local"})
            for data in (shipped, ours)
        ]
    onyx, bob = (read_wav_literally(r.content)[0] for r in replies)
    assert all(r.status_code == 200 for r in replies)
    assert abs(dominant_hz(onyx, RATE) - voice_hz(backend, "default")) < 3  # OpenAI names -> our default
    assert abs(dominant_hz(bob, RATE) - voice_hz(backend, "bob")) < 3


# ---- custom ---------------------------------------------------------------------------------------


async def test_custom_provider_post_as_in_our_docs():
    backend = fake()
    params = {"input": "{prompt_text}", "voice": "default", "response_format": "wav"}
    async with running_gateway(backend=backend) as gw:
        reply = await requests_post_json(
            f"{gw.url}/v1/audio/speech", fill(params, SEGMENT), {"X-Api-Key": "abc"}
        )
    pcm, _ = read_wav_literally(reply.content)
    assert reply.status_code == 200 and pcm.size == backend.num_samples_for(SEGMENT)


async def test_custom_provider_with_the_shipped_kokoro_params_gets_mp3():
    backend = fake()
    params = {"input": "{prompt_text}", "response_format": "mp3", "download_format": "mp3", "voice": "zf_xiaoxiao",
              "lang_code": "z", "return_download_link": True, "speed": 1, "stream": False}  # fmt: skip
    config = {"api": {"voice_aliases": {"zf_xiaoxiao": ""}}}  # map the shipped voice name onto ours
    async with running_gateway(config, backend=backend) as gw:
        reply = await requests_post_json(f"{gw.url}/v1/audio/speech", fill(params, SEGMENT), {})
    assert reply.status_code == 200 and reply.headers["content-type"] == "audio/mpeg"
    samples, rate = decode_audio(reply.content)  # pydub: ffmpeg -f mp3
    assert abs(samples.size / rate - backend.num_samples_for(SEGMENT) / RATE) < 0.1


async def test_custom_provider_get_with_query_parameters():
    backend = fake()
    params = {"text": "{prompt_text}", "voice": "default", "format": "wav", "stream": False, "extra": None}
    async with running_gateway({"api": {"api_keys": ["k"]}}, backend=backend) as gw:
        url = f"{gw.url}/v1/tts"
        reply = await requests_get(url, fill(params, SEGMENT), {"Authorization": "Bearer k"})
        no_key = await requests_get(url, fill(params, SEGMENT), {})
    pcm, _ = read_wav_literally(reply.content)
    assert reply.status_code == 200 and pcm.size == backend.num_samples_for(SEGMENT)
    assert no_key.status_code == 401


# ---- index_stream ---------------------------------------------------------------------------------


async def index_stream_segment(
    api_url: str, text: str, character: str
) -> tuple[int, list[bytes], float, float]:
    """aiohttp `session.post(api_url, json={...}, timeout=10)`, read piece by piece into 2880-byte frames.

    Returns (status, frames, seconds to the first frame, total seconds).
    """
    frames: list[bytes] = []
    buffer = b""
    start = time.monotonic()
    t_first = float("nan")
    body = json.dumps({"text": text, "character": character}).encode()
    headers = {"Content-Type": "application/json", "Accept": "*/*", "Accept-Encoding": "gzip, deflate",
               "User-Agent": "Python/3.10 aiohttp/3.9.5"}  # fmt: skip
    async with httpx.AsyncClient(timeout=10) as client:  # a new session per segment, 10 s in all
        async with client.stream("POST", api_url, content=body, headers=headers) as reply:
            if reply.status_code != 200:
                await reply.aread()
                return reply.status_code, [], t_first, time.monotonic() - start
            async for piece in reply.aiter_bytes():
                buffer += piece
                while len(buffer) >= 2880:
                    if not frames:
                        t_first = time.monotonic() - start
                    frames.append(buffer[:2880])
                    buffer = buffer[2880:]
    if len(buffer) % 2:
        raise AssertionError("odd PCM length")  # the incumbent fails the segment on an odd tail
    if buffer:
        frames.append(buffer + b"\0" * (2880 - len(buffer)))  # the last frame is zero-padded
    return 200, frames, t_first, time.monotonic() - start


async def test_index_stream_provider_gets_24k_pcm_frames_as_they_are_made():
    backend = slow(voices=("default", "jay_klee"))
    text = "今天是晴天我们一起去公园里散步吧"  # 16 chars -> 0.64 s of audio, ~0.7 s to compute
    async with running_gateway(backend=backend) as gw:
        status, frames, t_first, total = await index_stream_segment(f"{gw.url}/tts", text, "jay_klee")
    pcm = np.frombuffer(b"".join(frames), dtype="<i2")
    assert status == 200 and len(frames) == -(-backend.num_samples_for(text) // 1440)
    assert t_first < total / 2  # frames reach the device while the rest is still being synthesised
    assert abs(dominant_hz(pcm, RATE) - voice_hz(backend, "jay_klee")) < 3


async def test_index_stream_provider_with_a_key_in_the_url():
    async with running_gateway({"api": {"api_keys": ["k"]}}, backend=fake()) as gw:
        ok, frames, _, _ = await index_stream_segment(f"{gw.url}/tts?api_key=k", SEGMENT, "default")
        no_key, _, _, _ = await index_stream_segment(f"{gw.url}/tts", SEGMENT, "default")
    assert ok == 200 and frames
    assert no_key == 401


# ---- the incumbent's own voice names ----------------------------------------------------------------

KOKORO_PARAMS = {"input": "{prompt_text}", "response_format": "mp3", "download_format": "mp3", "voice": "zf_xiaoxiao",
                 "lang_code": "z", "return_download_link": True, "speed": 1, "stream": False}  # fmt: skip


async def test_voice_names_from_the_incumbent_config_are_spoken_in_the_default_voice(caplog):
    """`index_stream` as shipped (jay_klee) and by code default (xiao_he), `custom` as shipped (zf_xiaoxiao)."""
    backend = fake(voices=("default", "bob"))
    with caplog.at_level(logging.WARNING, logger="gateway.api.synthesis"):
        async with running_gateway(backend=backend) as gw:
            streamed = [
                await index_stream_segment(f"{gw.url}/tts", SEGMENT, name) for name in ("jay_klee", "xiao_he")
            ]
            again = await index_stream_segment(f"{gw.url}/tts", SEGMENT, "jay_klee")
            custom = await requests_post_json(f"{gw.url}/v1/audio/speech", fill(KOKORO_PARAMS, SEGMENT), {})
            ours = await index_stream_segment(f"{gw.url}/tts", SEGMENT, "bob")
    for status, frames, _, _ in [*streamed, again]:
        pcm = np.frombuffer(b"".join(frames), dtype="<i2")
        assert status == 200 and pcm.size >= backend.num_samples_for(SEGMENT)
        assert abs(dominant_hz(pcm, RATE) - voice_hz(backend, "default")) < 3
    assert custom.status_code == 200 and custom.headers["content-type"] == "audio/mpeg"
    samples, rate = decode_audio(custom.content)
    assert abs(dominant_hz(samples, rate) - voice_hz(backend, "default")) < 3
    bob = np.frombuffer(b"".join(ours[1]), dtype="<i2")
    assert abs(dominant_hz(bob, RATE) - voice_hz(backend, "bob")) < 3  # our own names still pick their voice
    logged = [r.getMessage() for r in caplog.records if "unknown voice" in r.getMessage()]
    assert len(logged) == 3 and all("default" in m for m in logged)  # once per name
    assert sum("jay_klee" in m for m in logged) == 1


async def test_strict_unknown_voice_refuses_them_fast():
    async with running_gateway({"api": {"unknown_voice": "strict"}}, backend=fake()) as gw:
        status, _, _, took = await index_stream_segment(f"{gw.url}/tts", SEGMENT, "jay_klee")
        custom = await requests_post_json(f"{gw.url}/v1/audio/speech", fill(KOKORO_PARAMS, SEGMENT), {})
        alias = await requests_post_json(
            f"{gw.url}/v1/audio/speech", {"model": "tts-1", "input": SEGMENT, "voice": "onyx"}, {}
        )
    assert status == 400 and took < 2  # fails fast: the incumbent has no retry here
    assert custom.status_code == 400 and custom.json()["error"] == {
        **custom.json()["error"], "code": "unknown_voice", "param": "voice"}  # fmt: skip
    assert "zf_xiaoxiao" in custom.json()["error"]["message"]
    assert alias.status_code == 200  # api.voice_aliases still apply
