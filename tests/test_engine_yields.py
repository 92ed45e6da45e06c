"""A step of a backend that splits its steps ends early (``should_yield``) for a device or interactive
request that arrived during it, even when it must queue for capacity (the next step's decode brings a
running LLM, and so a free slot, closer sooner than the work left undone would). A batch request's first
audio can wait: its arrival leaves the step's work where it is, and so does the request that woke an
idle engine (tts_engine/engine_loop.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from tts_engine import TTSEngine
from tts_engine.backends.base import BackendStream
from tts_engine.backends.fake import FakeBackend
from tts_engine.budget import BackendLimits, StepBudget

TEXT = "Hello there. This is a short test sentence."


class AsksToYield(FakeBackend):
    """Splits its steps: its first step hands the first stream's chunk out mid-step, waits (inside that
    step) until the test has made its second request, then records what ``should_yield()`` says."""

    def __init__(self, max_streams: int) -> None:
        super().__init__(16000, chunk_ms=100, ms_per_char=20.0)
        self.max_streams = max_streams
        self.second_made = threading.Event()
        self.answers: list[bool] = []

    def limits(self) -> BackendLimits:
        return BackendLimits(max_streams=self.max_streams, splits_steps=True)

    def step(  # type: ignore[override]
        self, streams: list[BackendStream], budget: StepBudget | None = None, **kw: Any
    ) -> list[Any]:
        if self.answers or kw.get("on_chunks") is None:
            return super().step(streams)
        chunks = super().step(streams)
        kw["on_chunks"]([(0, chunks[0])])
        assert self.second_made.wait(timeout=10), "the test never made its second request"
        self.answers.append(kw["should_yield"]())
        return [np.zeros(0, dtype=np.float32), *chunks[1:]]


async def read_all(stream: Any) -> int:
    async with asyncio.timeout(30):
        return sum([chunk.size async for chunk in stream])


@pytest.mark.parametrize(
    ("max_streams", "priority", "yields"),
    [(2, "device", True), (1, "interactive", True), (2, "batch", False), (2, None, False)],
    ids=["device", "interactive-queued", "batch", "none"],
)
async def test_a_step_ends_early_for_a_device_or_interactive_newcomer(
    max_streams: int, priority: str | None, yields: bool
) -> None:
    backend = AsksToYield(max_streams)
    engine = TTSEngine(backend)
    await engine.start()
    try:
        first = engine.synthesize(TEXT, priority="device")
        async with asyncio.timeout(10):
            chunk = await anext(aiter(first))  # handed out mid-step: the engine is still in that step
        assert chunk.size > 0
        second = None if priority is None else engine.synthesize(TEXT, priority=priority)  # type: ignore[arg-type]
        asyncio.get_running_loop().call_soon(backend.second_made.set)  # after this tick's requests went in
        assert await read_all(first) > 0  # served in full
        assert second is None or await read_all(second) > 0
    finally:
        await engine.close()
    assert backend.answers == [yields]
