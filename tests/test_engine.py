"""TTSEngine: the contract every backend passes (fake and espeak); its own rules: test_engine_rules.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from tests.engine_helpers import FAIL, LONG_TEXT, TEXT, MakeEngine, read_all, wait_until
from tests.engine_helpers import engines as engines  # a fixture: pytest finds it by this name
from tts_engine import EngineClosed, EngineOverloaded, SynthesisFailed, UnknownVoice
from tts_engine.backends.base import Backend
from tts_engine.backends.espeak import EspeakBackend
from tts_engine.backends.fake import FakeBackend
from tts_engine.resample import resample


class BrokenOnMarkerEspeak(EspeakBackend):
    """espeak-ng that is asked for a voice it does not have when the text holds the FAIL marker."""

    def command_for(self, text: str, voice: str, speed: float) -> list[str]:
        command = super().command_for(text, voice, speed)
        if FAIL in text:
            command[command.index("-v") + 1] = "zzqx"
        return command


def make_backend(name: str) -> Backend:
    if name == "fake":
        return FakeBackend(24000, chunk_ms=100, ms_per_char=20.0, fail_on=FAIL)
    return BrokenOnMarkerEspeak()


def native_audio(name: str, text: str, speed: float = 1.0) -> tuple[np.ndarray, int]:
    """What a fresh backend produces for ``text`` on its own, with no engine."""
    backend = make_backend(name)
    stream = backend.open_stream(text, backend.default_voice, speed)
    chunks = []
    while (chunk := stream.next_chunk()) is not None:
        chunks.append(chunk)
    stream.close()
    return np.concatenate(chunks), backend.sample_rate


# -- the contract, for every backend ---------------------------------------------------------------

contract = pytest.mark.parametrize("name", ["fake", "espeak"])


@contract
@pytest.mark.parametrize("rate", [16000, 24000])
async def test_chunks_are_int16_at_the_requested_rate_and_match_the_native_audio(
    name: str, rate: int, engines: MakeEngine
) -> None:
    engine = await engines(make_backend(name))
    async with engine.synthesize(TEXT, output_rate=rate) as stream:
        assert stream.sample_rate == rate
        chunks = await read_all(stream)
    assert len(chunks) > 1
    assert all(c.dtype == np.int16 and c.ndim == 1 and c.size > 0 for c in chunks)
    pcm = np.concatenate(chunks).astype(np.float64)

    native, native_rate = native_audio(name, TEXT)
    expected = resample(torch.from_numpy(native).double(), native_rate, rate).numpy() * 32767
    assert abs(pcm.size - expected.size) <= 2
    n = min(pcm.size, expected.size)
    assert np.max(np.abs(pcm[:n] - expected[:n])) <= 2  # the same audio, only rounding differs
    assert np.sqrt(np.mean(pcm**2)) > 0.02 * 32767


@contract
async def test_eight_concurrent_requests_all_complete(name: str, engines: MakeEngine) -> None:
    engine = await engines(make_backend(name))
    texts = [f"Request number {i}. " * (i + 1) for i in range(8)]
    streams = [engine.synthesize(text, output_rate=16000) for text in texts]
    results = await asyncio.gather(*(read_all(s) for s in streams))
    for text, chunks in zip(texts, results, strict=True):
        native, native_rate = native_audio(name, text)
        assert abs(sum(c.size for c in chunks) - native.size * 16000 / native_rate) <= 2
    await wait_until(lambda: engine.health()["live_requests"] == 0)
    assert engine.stats["requests_finished"] == 8


@contract
@pytest.mark.parametrize("how", ["abort", "aclose"])
async def test_abort_mid_stream_stops_delivery_and_frees_the_request(
    name: str, how: str, engines: MakeEngine
) -> None:
    engine = await engines(make_backend(name), max_buffered_chunks=2)
    stream = engine.synthesize(LONG_TEXT, req_id="r1")
    await anext(stream)
    if how == "abort":
        assert engine.abort("r1") is True
        assert engine.abort("r1") is False
    else:
        await stream.aclose()
        await stream.aclose()  # idempotent
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    await wait_until(lambda: engine.health()["live_requests"] == 0)
    assert engine.stats["requests_aborted"] == 1
    produced = engine.stats["chunks_total"]
    await asyncio.sleep(0.1)
    assert engine.stats["chunks_total"] == produced
    assert produced <= 3  # the chunk read plus at most max_buffered_chunks: nothing after the abort


@contract
async def test_a_failing_request_does_not_disturb_a_concurrent_one(name: str, engines: MakeEngine) -> None:
    engine = await engines(make_backend(name))
    good = engine.synthesize(TEXT, output_rate=16000)
    bad = engine.synthesize(f"this one will {FAIL} now", output_rate=16000)
    good_chunks, bad_result = await asyncio.gather(read_all(good), read_all(bad), return_exceptions=True)
    assert isinstance(bad_result, SynthesisFailed)
    assert bad_result.req_id == bad.req_id and bad_result.__cause__ is not None
    native, native_rate = native_audio(name, TEXT)
    assert isinstance(good_chunks, list)
    assert abs(sum(c.size for c in good_chunks) - native.size * 16000 / native_rate) <= 2
    assert engine.health()["errors"] == 1
    # the engine keeps serving
    assert len(await read_all(engine.synthesize(TEXT))) > 0


@contract
async def test_unknown_voice_is_rejected_at_synthesize(name: str, engines: MakeEngine) -> None:
    engine = await engines(make_backend(name))
    with pytest.raises(UnknownVoice) as info:
        engine.synthesize(TEXT, voice="nobody")
    assert info.value.available == engine.voices
    assert engine.stats["requests_total"] == 0


@contract
async def test_overload_at_the_pending_bound(name: str, engines: MakeEngine) -> None:
    engine = await engines(make_backend(name), max_pending_requests=2)
    first = engine.synthesize(TEXT)
    second = engine.synthesize(TEXT)
    with pytest.raises(EngineOverloaded):
        engine.synthesize(TEXT)
    assert engine.stats["requests_rejected"] == 1
    await read_all(first)  # a finished request frees its slot
    third = engine.synthesize(TEXT)
    await second.aclose()  # so does an aborted one
    fourth = engine.synthesize(TEXT)
    assert len(await read_all(third)) > 0 and len(await read_all(fourth)) > 0


@contract
async def test_backpressure_parks_an_unread_stream_while_others_flow(name: str, engines: MakeEngine) -> None:
    engine = await engines(make_backend(name), max_buffered_chunks=3)
    idle = engine.synthesize(LONG_TEXT, output_rate=16000)
    busy_chunks = await read_all(engine.synthesize(TEXT, output_rate=16000))
    await wait_until(lambda: idle.num_buffered == 3)
    steps = engine.stats["steps_total"]
    await asyncio.sleep(0.15)
    assert idle.num_buffered == 3  # nothing more was produced for it
    assert engine.stats["steps_total"] == steps  # and the engine thread sleeps instead of spinning
    assert engine.stats["chunks_total"] == len(busy_chunks) + 3
    rest = await read_all(idle)  # reading resumes it to the end
    native, native_rate = native_audio(name, LONG_TEXT)
    assert abs(sum(c.size for c in rest) - native.size * 16000 / native_rate) <= 2


@contract
@pytest.mark.parametrize("text", ["", "   \n\t "])
async def test_empty_text_gives_an_empty_stream(name: str, text: str, engines: MakeEngine) -> None:
    engine = await engines(make_backend(name))
    assert await read_all(engine.synthesize(text)) == []
    assert engine.stats["chunks_total"] == 0 and engine.stats["requests_total"] == 1


@contract
async def test_close_fails_open_streams_and_refuses_new_requests(name: str, engines: MakeEngine) -> None:
    backend = make_backend(name)
    engine = await engines(backend, max_buffered_chunks=2)
    stream = engine.synthesize(LONG_TEXT)
    await anext(stream)
    await engine.close()
    with pytest.raises(EngineClosed):
        await read_all(stream)
    with pytest.raises(EngineClosed):
        engine.synthesize(TEXT)
    assert engine.health()["state"] == "closed" and engine.health()["live_requests"] == 0
    await engine.close()  # idempotent
