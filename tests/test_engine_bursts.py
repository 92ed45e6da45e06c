"""A burst of requests made in one event-loop tick reaches the engine thread together."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tts_engine import TTSEngine
from tts_engine.backends.base import BackendStream
from tts_engine.backends.fake import FakeBackend

TEXT = "Hello there. This is a short test sentence."


class SlowToWake(FakeBackend):
    """Records each step's batch; ``wake()`` (called on every inbox put) is slow, as a busy
    producer thread would be, so an engine thread woken by a first request would run a step for it
    alone before the next one is put."""

    def __init__(self) -> None:
        super().__init__(16000, chunk_ms=100, ms_per_char=20.0)
        self.batches: list[int] = []

    def wake(self) -> None:
        time.sleep(0.02)

    def step(self, streams: list[BackendStream]) -> list[Any]:
        self.batches.append(len(streams))
        return super().step(streams)


async def read_all(stream: Any) -> int:
    async with asyncio.timeout(30):
        return sum([chunk.size async for chunk in stream])


async def test_requests_made_in_one_tick_start_in_one_step() -> None:
    backend = SlowToWake()
    engine = TTSEngine(backend)
    await engine.start()
    try:
        streams = [engine.synthesize(TEXT) for _ in range(6)]
        sizes = await asyncio.gather(*(read_all(s) for s in streams))
        assert all(size > 0 for size in sizes)
        assert backend.batches[0] == 6  # nobody was left a step behind the first
        later = engine.synthesize(TEXT)  # a request of a later tick is served as before
        assert await read_all(later) == sizes[0]
    finally:
        await engine.close()


async def test_an_abort_in_the_same_tick_still_wins() -> None:
    backend = SlowToWake()
    engine = TTSEngine(backend)
    await engine.start()
    try:
        doomed = engine.synthesize(TEXT, req_id="doomed")
        kept = engine.synthesize(TEXT)
        assert engine.abort("doomed")
        assert await read_all(kept) > 0
        assert doomed.is_aborted
        async with asyncio.timeout(10):
            while engine.stats["live"]:
                await asyncio.sleep(0.01)
        assert engine.stats["requests_aborted"] == 1  # the thread got the request before its abort
    finally:
        await engine.close()
