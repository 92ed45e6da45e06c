"""The official OpenAI Python SDK's ``audio.speech`` calls against /v1/audio/speech on a loopback server."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from audio_codecs.formats import decode_audio
from audio_codecs.wav import read_wav
from tests.api_helpers import RATE, CloningFakeBackend, dominant_hz, fake, voice_hz
from tests.gateway_server import running_gateway

TEXT = "The quick brown fox jumps over the lazy dog."


def sdk(gw, api_key: str = "sk-local") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=api_key, max_retries=0, timeout=20)


async def test_speech_create_default_mp3_and_wav():
    backend = fake()
    async with running_gateway(backend=backend) as gw:
        client = sdk(gw)
        mp3 = await client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        wav = await client.audio.speech.create(
            model="gpt-4o-mini-tts", voice="nova", input=TEXT, response_format="wav"
        )
        await client.close()
    samples, rate = decode_audio(mp3.content)
    assert mp3.response.headers["content-type"] == "audio/mpeg"
    assert abs(samples.size / rate - backend.num_samples_for(TEXT) / RATE) < 0.1
    pcm, rate = read_wav(wav.content)
    assert rate == RATE and pcm.size == backend.num_samples_for(TEXT)


async def test_streaming_response_of_pcm_with_a_voice_object_speed_and_instructions():
    backend = CloningFakeBackend(voices=("default", "bob"))
    async with running_gateway(backend=backend) as gw:
        del backend.instructions[:]  # the fixed phrases, made at start-up
        client = sdk(gw)
        pieces: list[bytes] = []
        async with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice={"id": "bob"}, input=TEXT, response_format="pcm", speed=1.5,
            instructions="Speak cheerfully.",
        ) as reply:  # fmt: skip
            assert reply.headers["content-type"] == "audio/pcm"
            async for piece in reply.iter_bytes():
                pieces.append(piece)
        await client.close()
    pcm = np.frombuffer(b"".join(pieces), dtype="<i2")
    assert pcm.size == backend.num_samples_for(TEXT, 1.5)
    assert abs(dominant_hz(pcm, RATE) - voice_hz(backend, "bob")) < 3
    assert backend.instructions == ["Speak cheerfully."]


async def test_sdk_raises_typed_errors_with_our_messages():
    config = {"api": {"api_keys": ["sk-right"], "unknown_voice": "strict"}}
    async with running_gateway(config, backend=fake()) as gw:
        wrong = sdk(gw, api_key="sk-wrong")
        with pytest.raises(openai.AuthenticationError) as auth:
            await wrong.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        right = sdk(gw, api_key="sk-right")
        with pytest.raises(openai.BadRequestError) as bad:
            await right.audio.speech.create(model="tts-1", voice="no-such-voice", input=TEXT)
        await wrong.close()
        await right.close()
    assert auth.value.status_code == 401 and "invalid API key" in str(auth.value)
    assert bad.value.status_code == 400 and "no-such-voice" in str(bad.value)
