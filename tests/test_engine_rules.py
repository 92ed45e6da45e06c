"""TTSEngine's own rules (fake backend): health, arguments, lifecycle, scheduling, batches and failures."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from tests.engine_helpers import FAIL, LONG_TEXT, TEXT, MakeEngine, read_all, wait_until
from tests.engine_helpers import engines as engines  # a fixture: pytest finds it by this name
from tts_engine import EngineClosed, EngineError, SynthesisFailed, TTSEngine
from tts_engine.backends.base import BackendStream
from tts_engine.backends.fake import FakeBackend
from tts_engine.budget import UNCAPPED, BackendLimits, StepBudget

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
