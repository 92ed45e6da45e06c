"""Shared pieces of the TTSEngine tests: texts, the ``engines`` fixture, reading a stream, waiting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from tts_engine import SynthesisStream, TTSEngine
from tts_engine.backends.base import Backend

FAIL = "FAILNOW"
TEXT = "Hello there. This is a short test sentence."
LONG_TEXT = "This is a much longer piece of text that keeps the engine busy for many chunks. " * 3

MakeEngine = Callable[..., Awaitable[TTSEngine]]


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
