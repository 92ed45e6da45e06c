"""POST/GET /v1/tts, POST /v1/tts/stream, POST /v1/audio/speech, POST /tts against a real loopback server."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time

import httpx
import numpy as np
import pytest

from audio_codecs.formats import decode_audio
from audio_codecs.wav import read_wav
from tests.api_helpers import RATE, CloningFakeBackend, dominant_hz, fake, slow, voice_hz, wait_until
from tests.gateway_server import running_gateway
from tts_engine.backends.fake import FakeBackend

TEXT = "今天天气很好，我们去公园玩吧"


def expected_seconds(backend, text: str, speed: float = 1.0) -> float:
    return backend.num_samples_for(text, speed) / backend.sample_rate


# ---- whole files ---------------------------------------------------------------------------------


async def test_tts_returns_a_whole_wav_file_by_default():
    backend = fake()
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        reply = await client.post(f"{gw.url}/v1/tts", json={"text": TEXT})
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "audio/wav"
    samples, rate = read_wav(reply.content)
    assert rate == RATE
    assert samples.size == backend.num_samples_for(TEXT)
    assert abs(dominant_hz(samples, rate) - 220.0) < 3


@pytest.mark.parametrize(
    ("fmt", "content_type"),
    [("mp3", "audio/mpeg"), ("opus", "audio/ogg; codecs=opus"), ("flac", "audio/flac"), ("aac", "audio/aac")],
)
async def test_tts_encodes_compressed_formats(fmt, content_type):
    backend = fake()
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        reply = await client.post(f"{gw.url}/v1/tts", json={"text": TEXT, "format": fmt})
    assert reply.status_code == 200 and reply.headers["content-type"] == content_type
    samples, rate = decode_audio(reply.content)
    # codecs add priming/padding samples, never more than a few frames
    assert abs(samples.size / rate - expected_seconds(backend, TEXT)) < 0.1
    assert abs(dominant_hz(samples, rate) - 220.0) < 3


async def test_tts_pcm_sample_rate_speed_and_voice():
    backend = fake(voices=("default", "bob"))
    body = {"text": TEXT, "format": "pcm", "sample_rate": 16000, "speed": 2.0, "voice": "bob"}
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        reply = await client.post(f"{gw.url}/v1/tts", json=body)
        by_get = await client.get(f"{gw.url}/v1/tts", params={"text": TEXT, "voice": "bob", "format": "pcm",
                                                               "sample_rate": 16000, "speed": 2.0})  # fmt: skip
    assert reply.status_code == 200 and reply.headers["content-type"] == "audio/pcm"
    assert reply.headers["x-sample-rate"] == "16000"
    pcm = np.frombuffer(reply.content, dtype="<i2")
    assert abs(pcm.size / 16000 - expected_seconds(backend, TEXT, 2.0)) < 0.01
    assert abs(dominant_hz(pcm, 16000) - voice_hz(backend, "bob")) < 3
    assert by_get.status_code == 200 and by_get.content == reply.content


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"voice": "nobody"}, "voice", "unknown_voice"),
        ({"format": "ogg"}, "format", "unsupported_format"),
        ({"format": "opus", "sample_rate": 22050}, "format", "unsupported_format"),
        ({"sample_rate": 11025}, "sample_rate", "unsupported_sample_rate"),
        ({"speed": 5}, "speed", "invalid_request"),
        ({"text": "   "}, "text", "empty_text"),
        ({"text": "x" * 51}, "text", "text_too_long"),
        ({"text": None}, "text", "invalid_request"),
    ],
)
async def test_tts_bad_requests_get_a_clear_400(body, param, code):
    config = {"api": {"max_text_chars": 50, "unknown_voice": "strict"}}
    async with running_gateway(config, backend=fake()) as gw:
        before = gw.services.engine.stats["requests_total"]  # the fixed phrases, made at start-up
        async with httpx.AsyncClient() as client:
            reply = await client.post(f"{gw.url}/v1/tts", json={"text": "你好", **body})
        submitted = gw.services.engine.stats["requests_total"] - before
    assert reply.status_code == 400 and reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert error["param"] == param and error["code"] == code and error["message"]
    assert submitted == 0  # refused before the engine saw it


async def test_tts_body_that_is_not_json_gets_400():
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient() as client:
        reply = await client.post(
            f"{gw.url}/v1/tts", content=b"{not json", headers={"content-type": "application/json"}
        )
    assert reply.status_code == 400 and "error" in reply.json()


async def test_oversized_bodies_are_refused_before_parsing():
    async with (
        running_gateway({"api": {"max_text_chars": 50}}, backend=fake()) as gw,
        httpx.AsyncClient() as client,
    ):
        reply = await client.post(f"{gw.url}/v1/tts", json={"text": "x" * 200_000})
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "body_too_large"


async def test_busy_engine_answers_503_with_retry_after():
    async with running_gateway(backend=slow()) as gw, httpx.AsyncClient() as client:
        gw.services.engine.max_pending_requests = 1
        async with client.stream("POST", f"{gw.url}/v1/tts/stream", json={"text": TEXT * 3}) as first:
            assert first.status_code == 200
            second = await client.post(f"{gw.url}/v1/tts", json={"text": TEXT})
    assert second.status_code == 503 and second.headers["retry-after"] == "1"
    assert second.json()["error"]["code"] == "overloaded"


async def test_failure_before_the_first_chunk_is_a_500_with_a_message():
    backend = fake(fail_on="BOOM", fail_after_chunks=0)
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        whole = await client.post(f"{gw.url}/v1/tts", json={"text": "BOOM now"})
        streamed = await client.post(f"{gw.url}/v1/tts/stream", json={"text": "BOOM now"})
    for reply in (whole, streamed):
        assert reply.status_code == 500 and reply.json()["error"]["code"] == "synthesis_failed"


class PickyBackend(FakeBackend):
    def open_stream(self, text, voice, speed):
        if len(text) > 10:
            raise ValueError(f"text is {len(text)} characters, the limit is 10")
        return super().open_stream(text, voice, speed)


async def test_input_the_backend_refuses_is_a_400():
    async with running_gateway(backend=PickyBackend(ms_per_char=20.0)) as gw, httpx.AsyncClient() as client:
        reply = await client.post(f"{gw.url}/v1/tts/stream", json={"text": "x" * 11})
    assert reply.status_code == 400 and "the limit is 10" in reply.json()["error"]["message"]


async def test_failure_mid_stream_cuts_the_body_short():
    backend = fake(fail_on="BOOM", fail_after_chunks=2)
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(f"{gw.url}/v1/tts/stream", json={"text": "BOOM " * 20, "format": "pcm"})


# ---- streaming -----------------------------------------------------------------------------------


async def first_bytes_and_rest(
    gw, client, path: str, body: dict
) -> tuple[float, int, bytes, float, httpx.Headers]:
    """(time to first bytes, live engine requests at that moment, whole body, total time, headers)."""
    start = time.monotonic()
    parts: list[bytes] = []
    async with client.stream("POST", f"{gw.url}{path}", json=body) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for part in reply.aiter_raw():
            if not parts:
                t_first, live_at_first = time.monotonic() - start, gw.services.engine.stats["live"]
            parts.append(part)
        headers = reply.headers
    return t_first, live_at_first, b"".join(parts), time.monotonic() - start, headers


async def test_stream_sends_a_streaming_wav_before_synthesis_has_finished():
    backend = slow()
    text = "一二三四五六七八九十" * 2  # 20 chars -> 0.8 s of audio in 8 chunks of 0.1 s compute each
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        t_first, live, body, total, headers = await first_bytes_and_rest(
            gw, client, "/v1/tts/stream", {"text": text}
        )
    assert headers["content-type"] == "audio/wav" and headers.get("transfer-encoding") == "chunked"
    assert live == 1  # the engine was still working on this text when its first bytes arrived
    assert total > 0.7 and t_first < total / 2
    assert body[:4] == b"RIFF" and struct.unpack_from("<I", body, 40)[0] == 0xFFFFFFFF
    samples, rate = read_wav(body)
    assert rate == RATE and samples.size == backend.num_samples_for(text)


@pytest.mark.parametrize("fmt", ["pcm", "mp3", "opus", "aac", "flac"])
async def test_stream_formats_arrive_in_pieces_and_decode(fmt):
    backend = slow(compute_delay_s=0.05)
    text = "一二三四五六七八九十" * 2
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        t_first, live, body, total, headers = await first_bytes_and_rest(
            gw, client, "/v1/tts/stream", {"text": text, "format": fmt}
        )
    assert live == 1 and t_first < total
    if fmt == "pcm":
        assert headers["content-type"] == "audio/pcm" and len(body) == 2 * backend.num_samples_for(text)
    else:
        samples, rate = decode_audio(body)
        assert abs(samples.size / rate - expected_seconds(backend, text)) < 0.1


async def test_client_disconnect_mid_stream_aborts_the_engine_request_at_once():
    backend = slow()
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        closed_at_start = backend.num_streams_closed  # the fixed phrases, made at start-up
        async with client.stream("POST", f"{gw.url}/v1/tts/stream", json={"text": TEXT * 10}) as reply:
            async for _ in reply.aiter_raw():
                break  # over 5 s of synthesis left when we hang up
            assert gw.services.engine.stats["live"] == 1
        waited = await wait_until(lambda: gw.services.engine.stats["live"] == 0, timeout=3.0)
        stats = gw.services.engine.stats
    assert waited < 1.0 and stats["requests_aborted"] == 1 and backend.num_streams_closed - closed_at_start == 1


async def test_client_disconnect_while_a_whole_file_is_synthesised_aborts_too():
    backend = slow()
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        task = asyncio.create_task(client.post(f"{gw.url}/v1/tts", json={"text": TEXT * 10}))
        await wait_until(lambda: gw.services.engine.stats["live"] == 1)
        task.cancel()
        waited = await wait_until(lambda: gw.services.engine.stats["live"] == 0, timeout=3.0)
        assert gw.services.engine.stats["requests_aborted"] == 1
    assert waited < 1.0  # with over 5 s of synthesis left


# ---- OpenAI /v1/audio/speech ---------------------------------------------------------------------


async def test_openai_speech_defaults_to_mp3_and_maps_openai_voices_to_the_default():
    backend = fake(voices=("default", "bob"))
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        reply = await client.post(
            f"{gw.url}/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "alloy"}
        )
    assert reply.status_code == 200 and reply.headers["content-type"] == "audio/mpeg"
    samples, rate = decode_audio(reply.content)
    assert abs(dominant_hz(samples, rate) - voice_hz(backend, "default")) < 3


async def test_openai_speech_wav_is_whole_with_exact_sizes_and_voice_objects_work():
    backend = fake(voices=("default", "bob"))
    body = {"model": "gpt-4o-mini-tts", "input": TEXT, "voice": {"id": "bob"}, "response_format": "wav"}
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        reply = await client.post(f"{gw.url}/v1/audio/speech", json=body)
    assert reply.status_code == 200 and reply.headers["content-type"] == "audio/wav"
    assert int(reply.headers["content-length"]) == len(reply.content)
    assert struct.unpack_from("<I", reply.content, 40)[0] == len(reply.content) - 44
    samples, rate = read_wav(reply.content)
    assert abs(dominant_hz(samples, rate) - voice_hz(backend, "bob")) < 3


async def test_openai_instructions_reach_the_backend_as_instruct_mode():
    backend = CloningFakeBackend()
    body = {
        "model": "tts-1",
        "input": TEXT,
        "voice": "default",
        "instructions": "用四川话说",
        "response_format": "pcm",
    }
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        del backend.instructions[:]  # the fixed phrases, made at start-up
        reply = await client.post(f"{gw.url}/v1/audio/speech", json=body)
    assert reply.status_code == 200 and reply.headers["content-type"] == "audio/pcm"
    assert backend.instructions == ["用四川话说"]


async def test_openai_sse_stream_of_deltas_then_done():
    backend = slow(compute_delay_s=0.05)
    body = {"model": "gpt-4o-mini-tts", "input": TEXT, "voice": "alloy", "response_format": "pcm",
            "stream_format": "sse"}  # fmt: skip
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        t_first, live, raw, total, headers = await first_bytes_and_rest(gw, client, "/v1/audio/speech", body)
    assert headers["content-type"].startswith("text/event-stream") and live == 1
    events = [json.loads(block[len("data: ") :]) for block in raw.decode().split("\n\n") if block]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["input_tokens"] == len(TEXT)
    pcm = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), dtype="<i2")
    assert pcm.size == backend.num_samples_for(TEXT)


async def test_openai_errors_use_the_openai_error_shape():
    strict = {"api": {"unknown_voice": "strict"}}  # unknown voices are refused, not spoken in the default
    async with running_gateway(strict, backend=fake()) as gw, httpx.AsyncClient() as client:
        no_input = await client.post(f"{gw.url}/v1/audio/speech", json={"model": "tts-1", "voice": "alloy"})
        bad_voice = await client.post(f"{gw.url}/v1/audio/speech", json={"input": "hi", "voice": "zzz"})
        bad_format = await client.post(
            f"{gw.url}/v1/audio/speech", json={"input": "hi", "response_format": "ogg"}
        )
    assert no_input.status_code == 400 and no_input.json()["error"]["param"] == "input"
    assert bad_voice.status_code == 400 and bad_voice.json()["error"]["code"] == "unknown_voice"
    assert bad_format.status_code == 400 and bad_format.json()["error"]["param"] == "response_format"
    assert set(bad_voice.json()["error"]) == {"message", "type", "param", "code"}


# ---- /tts (index_stream shape) -------------------------------------------------------------------


async def test_tts_character_streams_raw_24k_pcm():
    backend = slow(compute_delay_s=0.05, voices=("default", "jay"))
    async with running_gateway(backend=backend) as gw, httpx.AsyncClient() as client:
        t_first, live, body, total, headers = await first_bytes_and_rest(
            gw, client, "/tts", {"text": TEXT, "character": "jay"}
        )
        unknown = await client.post(f"{gw.url}/tts", json={"text": TEXT, "character": "nobody"})
    assert headers["content-type"] == "application/octet-stream" and live == 1
    assert body[:4] != b"RIFF" and len(body) % 2 == 0
    pcm = np.frombuffer(body, dtype="<i2")
    assert pcm.size == backend.num_samples_for(TEXT)  # 24 kHz, as the fake's native rate
    assert abs(dominant_hz(pcm, RATE) - voice_hz(backend, "jay")) < 3
    fallback = np.frombuffer(unknown.content, dtype="<i2")  # api.unknown_voice: fallback (the default)
    assert unknown.status_code == 200 and abs(dominant_hz(fallback, RATE) - voice_hz(backend, "default")) < 3


async def test_openapi_documents_every_endpoint():
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient() as client:
        spec = (await client.get(f"{gw.url}/openapi.json")).json()
    paths = spec["paths"]
    for path, method in [("/v1/tts", "post"), ("/v1/tts", "get"), ("/v1/tts/stream", "post"),
                         ("/v1/audio/speech", "post"), ("/tts", "post"), ("/tts/zero_shot", "post"),
                         ("/v1/voices", "get"), ("/v1/voices", "post"), ("/v1/voices/{name}", "delete"),
                         ("/v1/health", "get")]:  # fmt: skip
        assert method in paths[path], (path, method)
    assert "audio/mpeg" in paths["/v1/audio/speech"]["post"]["responses"]["200"]["content"]
