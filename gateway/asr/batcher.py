"""Micro-batching of recognition requests from many sessions onto one model.

Requests wait in a bounded queue. One worker task takes everything waiting (up
to `max_batch` items and `max_weight` total weight, e.g. seconds of audio) and
runs the batch function in a single dedicated thread, so the model is only ever
called from that thread and the event loop never blocks. While a batch runs,
new requests pile up and form the next batch: no timer, no added latency when
the load is light. A request whose caller gave up (cancelled) before its batch
started is left out of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class BatcherFull(Exception):
    """More requests are waiting than the queue bound allows."""


class BatcherClosed(Exception):
    """The batcher was closed before the request was served."""


@dataclass
class BatcherStats:
    requests: int = 0
    batches: int = 0
    refused: int = 0
    failed_batches: int = 0
    max_batch_seen: int = 0
    busy_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)


@dataclass
class _Request(Generic[T, R]):
    item: T
    weight: float
    future: asyncio.Future[R]


class Batcher(Generic[T, R]):
    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        max_weight: float = float("inf"),
        weight: Callable[[T], float] = lambda _: 1.0,
        name: str = "batcher",
        initializer: Callable[[], None] | None = None,
    ) -> None:
        """`initializer` runs once in the worker thread (e.g. to set torch's thread count there)."""
        if max_batch < 1 or max_queue < 1 or max_weight <= 0:
            raise ValueError("max_batch, max_queue and max_weight must be positive")
        self._run_batch = run_batch
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.max_weight = max_weight
        self._weight = weight
        self._name = name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=initializer)
        self._pending: list[_Request[T, R]] = []
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.stats = BatcherStats()

    @property
    def waiting(self) -> int:
        return len(self._pending)

    async def submit(self, item: T) -> R:
        """The result for `item`, computed in some batch."""
        if self._closed:
            raise BatcherClosed(f"{self._name} is closed")
        self._ensure_worker()
        if len(self._pending) >= self.max_queue:
            self.stats.refused += 1
            raise BatcherFull(f"{self._name}: {len(self._pending)} requests already waiting")
        loop = asyncio.get_running_loop()
        request = _Request(item, float(self._weight(item)), loop.create_future())
        self._pending.append(request)
        self.stats.requests += 1
        self._wakeup.set()
        return await request.future

    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._worker is not None and not self._worker.done() and self._loop is loop:
            return
        # First use, or a new event loop (tests): requests of a dead loop cannot be answered.
        self._fail_pending(BatcherClosed(f"{self._name} moved to another event loop"))
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._worker = loop.create_task(self._work(), name=f"{self._name}-worker")

    def _fail_pending(self, exc: Exception) -> None:
        for request in self._pending:
            with contextlib.suppress(RuntimeError):  # a future of a closed loop
                if not request.future.done():
                    request.future.set_exception(exc)
        self._pending.clear()

    def _next_batch(self) -> list[_Request[T, R]]:
        batch: list[_Request[T, R]] = []
        weight = 0.0
        while self._pending and len(batch) < self.max_batch:
            request = self._pending[0]
            if request.future.done():  # cancelled while waiting
                self._pending.pop(0)
                continue
            if batch and weight + request.weight > self.max_weight:
                break
            batch.append(self._pending.pop(0))
            weight += request.weight
        return batch

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        wakeup = self._wakeup
        while True:
            await wakeup.wait()
            wakeup.clear()
            while batch := self._next_batch():
                await self._run(loop, batch)

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Request[T, R]]) -> None:
        items = [r.item for r in batch]
        started = loop.time()
        try:
            # Shielded: cancelling the worker must not abandon a batch mid-run in its thread.
            results = await asyncio.shield(loop.run_in_executor(self._executor, self._run_batch, items))
            if len(results) != len(items):
                raise RuntimeError(f"batch of {len(items)} gave {len(results)} results")
        except asyncio.CancelledError:
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(BatcherClosed(f"{self._name} is closed"))
            raise
        except Exception as exc:
            self.stats.failed_batches += 1
            log.warning("%s: batch of %d failed: %s", self._name, len(batch), exc)
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(exc)
            return
        finally:
            self.stats.busy_s += loop.time() - started
        self.stats.batches += 1
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(batch))
        if len(self.stats.batch_sizes) < 10_000:
            self.stats.batch_sizes.append(len(batch))
        for request, result in zip(batch, results, strict=True):
            if not request.future.done():
                request.future.set_result(result)

    async def aclose(self) -> None:
        self._closed = True
        worker, self._worker = self._worker, None
        if worker is not None and not worker.done() and self._loop is asyncio.get_running_loop():
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        self._fail_pending(BatcherClosed(f"{self._name} is closed"))
        self._executor.shutdown(wait=False, cancel_futures=True)
