"""TTSEngine: the contract every backend passes (fake and espeak), then the engine's own rules."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import torch

from tts_engine import (
    EngineClosed,
    EngineError,
    EngineOverloaded,
    SynthesisFailed,
    SynthesisStream,
    TTSEngine,
    UnknownVoice,
)
from tts_engine.backends.base import Backend, BackendStream
from tts_engine.backends.espeak import EspeakBackend
from tts_engine.backends.fake import FakeBackend
from tts_engine.budget import UNCAPPED, BackendLimits, StepBudget
from tts_engine.resample import resample

FAIL = "FAILNOW"
TEXT = "Hello there. This is a short test sentence."
LONG_TEXT = "This is a much longer piece of text that keeps the engine busy for many chunks. " * 3

MakeEngine = Callable[..., Awaitable[TTSEngine]]


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


async def read_all(stream: SynthesisStream) -> list[np.ndarray]:
    async with asyncio.timeout(20):  # a stalled engine fails the test instead of hanging it
        return [chunk async for chunk in stream]


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


@pytest.fixture
async def engines() -> AsyncIterator[MakeEngine]:
    made: list[TTSEngine] = []

    async def make(backend: Backend, **options: Any) -> TTSEngine:
        engine = TTSEngine(backend, **options)
        await engine.start()
        made.append(engine)
        return engine

    yield make
    for engine in made:
        await engine.close()


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


# -- the engine's own rules (fake backend) -----------------------------------------------------------


async def test_properties_and_health_describe_the_backend(engines: MakeEngine) -> None:
    engine = await engines(FakeBackend(22050, voices=("alice", "bob")))
    assert (engine.backend_name, engine.sample_rate, engine.voices, engine.default_voice) == (
        "fake", 22050, ["alice", "bob"], "alice",
    )  # fmt: skip
    health = engine.health()
    assert (
        health["backend"] == "fake" and health["voices"] == ["alice", "bob"] and health["state"] == "running"
    )
    assert {"live_requests", "queue_depth", "requests_total", "errors"} <= health.keys()
    assert {
        "requests_total",
        "requests_failed",
        "requests_aborted",
        "chunks_total",
        "queue_depth",
        "live",
    } <= (engine.stats.keys())


async def test_bad_arguments_raise_typed_errors(engines: MakeEngine) -> None:
    engine = await engines(FakeBackend())
    with pytest.raises(ValueError, match="sample_rate"):
        engine.synthesize(TEXT, output_rate=11025)
    for speed in (0.0, 10.0, True, float("nan")):
        with pytest.raises(ValueError, match="speed"):
            engine.synthesize(TEXT, speed=speed)
    with pytest.raises(TypeError):
        engine.synthesize(b"bytes")  # type: ignore[arg-type]
    engine.synthesize(TEXT, req_id="same")
    with pytest.raises(ValueError, match="already in use"):
        engine.synthesize(TEXT, req_id="same")
    with pytest.raises(ValueError):
        TTSEngine(FakeBackend(), max_buffered_chunks=0)
    with pytest.raises(ValueError):
        TTSEngine(FakeBackend(), max_pending_requests=0)


async def test_synthesize_before_start_raises_and_close_before_start_closes_the_backend() -> None:
    backend = FakeBackend()
    engine = TTSEngine(backend)
    with pytest.raises(EngineError, match="not started"):
        engine.synthesize(TEXT)
    await engine.close()
    assert backend.closed
    with pytest.raises(EngineClosed):
        await engine.start()


async def test_close_closes_the_backend_and_every_backend_stream(engines: MakeEngine) -> None:
    backend = FakeBackend(compute_delay_s=0.01)
    engine = await engines(backend, max_buffered_chunks=1)
    streams = [engine.synthesize(LONG_TEXT) for _ in range(3)]
    await anext(streams[0])
    await engine.close()
    assert backend.closed
    assert backend.num_streams_closed == backend.num_streams_opened == 3


async def test_chunks_stream_out_as_they_are_computed(engines: MakeEngine) -> None:
    engine = await engines(FakeBackend(16000, chunk_ms=100, ms_per_char=100.0, compute_delay_s=0.05))
    arrivals = []
    async for _ in engine.synthesize("0123456789"):  # 10 chunks, each 0.05 s of compute
        arrivals.append(time.monotonic())
    assert len(arrivals) == 10
    assert arrivals[-1] - arrivals[0] >= 0.4  # the first chunk came out while nine were still to compute


async def test_a_new_request_is_served_before_streams_that_are_ahead(engines: MakeEngine) -> None:
    backend = FakeBackend(16000, chunk_ms=100, ms_per_char=100.0, compute_delay_s=0.02)
    backend.max_batch_size = 1  # one stream per step: the ranking decides who goes next
    engine = await engines(backend, max_buffered_chunks=50)
    ahead = engine.synthesize("x" * 40)  # 40 chunks, nobody reads them
    await wait_until(lambda: ahead.num_buffered >= 3)
    produced_before = engine.stats["chunks_total"]
    newcomer = engine.synthesize("short")
    await anext(newcomer)
    # the newcomer went next: the stream that was ahead got at most the step already under way
    assert engine.stats["chunks_total"] - produced_before <= 3
    assert not ahead.is_finished
    await ahead.aclose()


async def test_steps_respect_the_backends_max_batch_size(engines: MakeEngine) -> None:
    sizes: list[int] = []

    class Recording(FakeBackend):
        max_batch_size = 3

        def step(self, streams: list[BackendStream]) -> list[Any]:
            sizes.append(len(streams))
            return super().step(streams)

    engine = await engines(Recording(16000))
    await asyncio.gather(*(read_all(engine.synthesize(TEXT)) for _ in range(7)))
    assert max(sizes) == 3


async def test_cancelling_the_reading_task_aborts_the_request(engines: MakeEngine) -> None:
    backend = FakeBackend(16000, chunk_ms=100, compute_delay_s=0.2)
    engine = await engines(backend)
    stream = engine.synthesize(LONG_TEXT)
    task = asyncio.create_task(read_all(stream))
    await asyncio.sleep(0.05)  # the task now waits inside the stream for the first chunk
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stream.is_aborted
    await wait_until(lambda: engine.stats["live"] == 0)
    assert engine.stats["requests_aborted"] == 1
    await wait_until(lambda: backend.num_streams_closed == 1)


async def test_an_abort_during_a_step_drops_that_steps_output(engines: MakeEngine) -> None:
    backend = FakeBackend(16000, chunk_ms=100, compute_delay_s=0.2)
    engine = await engines(backend, max_buffered_chunks=1)
    stream = engine.synthesize(LONG_TEXT)
    await anext(stream)  # the engine now computes the next chunk for 0.2 s
    await asyncio.sleep(0.05)
    produced = engine.stats["chunks_total"]
    await stream.aclose()
    await wait_until(lambda: engine.stats["live"] == 0)
    assert engine.stats["chunks_total"] == produced


async def test_speed_changes_the_duration(engines: MakeEngine) -> None:
    engine = await engines(FakeBackend(16000, ms_per_char=50.0))
    normal = sum(c.size for c in await read_all(engine.synthesize("abcdefgh")))
    fast = sum(c.size for c in await read_all(engine.synthesize("abcdefgh", speed=2.0)))
    assert normal == 6400 and fast == 3200


async def test_the_engine_admits_against_declared_limits_and_hands_each_step_its_budget(
    engines: MakeEngine,
) -> None:
    budgets: list[StepBudget] = []
    open_at_once: list[int] = []

    class Capped(FakeBackend):
        max_batch_size = 3

        def limits(self) -> BackendLimits:
            return BackendLimits(max_streams=2, max_batch_size=3, max_prefill_rows=1, max_hop_rows=1)

        def step(self, streams: list[BackendStream], budget: StepBudget = UNCAPPED) -> list[Any]:
            budgets.append(budget)
            open_at_once.append(len(streams))
            return super().step(streams)

    engine = await engines(Capped(16000))
    await asyncio.gather(*(read_all(engine.synthesize(TEXT)) for _ in range(5)))
    assert budgets and set(budgets) == {StepBudget(prefill_rows=1, hop_rows=1)}
    assert max(open_at_once) == 2  # never more streams than the declared capacity
    health = engine.health()["batching"]
    assert health["capacity"] == 2 and health["max_batch_size"] == 3


class _ExplodingStepBackend(FakeBackend):
    """The whole batch fails while ``explode`` is set (a batching backend's failure)."""

    explode = True

    def step(self, streams: list[BackendStream]) -> list[Any]:
        if self.explode:
            self.explode = False
            raise RuntimeError("batch exploded")
        return super().step(streams)


async def test_a_failing_batch_fails_its_requests_and_the_engine_goes_on(engines: MakeEngine) -> None:
    engine = await engines(_ExplodingStepBackend(16000))
    with pytest.raises(SynthesisFailed, match="batch exploded"):
        await read_all(engine.synthesize(TEXT))
    assert len(await read_all(engine.synthesize(TEXT))) > 0


class _BadChunkBackend(FakeBackend):
    def open_stream(self, text: str, voice: str, speed: float) -> BackendStream:
        if "open-fails" in text:
            raise OSError("cannot start")
        inner = super().open_stream(text, voice, speed)

        class TwoDimensional(BackendStream):
            def next_chunk(self) -> np.ndarray | None:
                chunk = inner.next_chunk()
                return None if chunk is None else chunk.reshape(1, -1)

        return TwoDimensional() if "2d" in text else inner


@pytest.mark.parametrize("text", ["2d chunks please", "open-fails"])
async def test_bad_chunks_and_failed_opens_fail_only_that_request(text: str, engines: MakeEngine) -> None:
    engine = await engines(_BadChunkBackend(16000))
    good = engine.synthesize(TEXT)
    with pytest.raises(SynthesisFailed):
        await read_all(engine.synthesize(text))
    assert len(await read_all(good)) > 0
    assert engine.stats["requests_failed"] == 1


async def test_buffered_chunks_are_delivered_before_a_failure(engines: MakeEngine) -> None:
    engine = await engines(FakeBackend(16000, chunk_ms=100, fail_on=FAIL, fail_after_chunks=3))
    received = []
    with pytest.raises(SynthesisFailed):
        async for chunk in engine.synthesize(f"{FAIL} " * 10):
            received.append(chunk)
    assert len(received) >= 2  # the first chunks (the resampler holds back a little of the last one)


async def test_a_second_reader_of_one_stream_is_refused(engines: MakeEngine) -> None:
    engine = await engines(FakeBackend(16000, compute_delay_s=0.5))
    stream = engine.synthesize(TEXT)
    first_reader = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.02)
    with pytest.raises(RuntimeError, match="another task"):
        await anext(stream)
    assert (await first_reader).dtype == np.int16
    await stream.aclose()


class _Fatal(BaseException):
    """Not an Exception: escapes the per-request handling, as an engine bug would."""


class _CrashingBackend(FakeBackend):
    def step(self, streams: list[BackendStream]) -> list[Any]:
        raise _Fatal("engine bug")


async def test_a_crashed_engine_thread_fails_open_streams_and_reports_it(engines: MakeEngine) -> None:
    backend = _CrashingBackend(16000)
    engine = await engines(backend)
    with pytest.raises(EngineClosed, match="crashed") as info:
        await read_all(engine.synthesize(TEXT))
    assert isinstance(info.value.__cause__, _Fatal)
    assert engine.health()["state"] == "crashed"
    assert backend.closed and backend.num_streams_closed == backend.num_streams_opened == 1
    with pytest.raises(EngineClosed):
        engine.synthesize(TEXT)
