"""Micro-batching of many sessions' requests onto one model thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.asr.batcher import Batcher, BatcherClosed, BatcherFull


class SlowModel:
    """Records batches; each call blocks until released (or sleeps), in the batcher's thread."""

    def __init__(self, delay_s: float = 0.0, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items: list[str]) -> list[str]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(items))
        self.gate.wait(5)
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        if self.fail_on is not None and self.fail_on in items:
            raise RuntimeError("model broke")
        return [item.upper() for item in items]


async def test_requests_waiting_during_a_batch_form_the_next_batch():
    model = SlowModel()
    model.gate.clear()
    batcher = Batcher(model, max_batch=8)
    first = asyncio.create_task(batcher.submit("a"))
    await asyncio.sleep(0.05)  # "a" is running alone
    rest = [asyncio.create_task(batcher.submit(x)) for x in "bcdef"]
    await asyncio.sleep(0.05)
    model.gate.set()
    assert await first == "A"
    assert await asyncio.gather(*rest) == list("BCDEF")
    assert model.batches == [["a"], list("bcdef")]
    assert batcher.stats.batches == 2 and batcher.stats.max_batch_seen == 5
    assert model.threads == {next(iter(model.threads))} and "asr" not in threading.current_thread().name
    await batcher.aclose()


async def test_batches_respect_count_and_weight_limits():
    model = SlowModel()
    model.gate.clear()
    batcher = Batcher(model, max_batch=3, max_weight=10, weight=lambda s: float(len(s)))
    blocker = asyncio.create_task(batcher.submit("x"))
    await asyncio.sleep(0.05)
    items = ["aaaa", "bbbb", "cccc", "d", "e", "f", "g", "hhhhhhhhhhhh"]
    tasks = [asyncio.create_task(batcher.submit(i)) for i in items]
    await asyncio.sleep(0.05)
    model.gate.set()
    await blocker
    assert await asyncio.gather(*tasks) == [i.upper() for i in items]
    # weight 4+4 <= 10 (a third would be 12); then count 3; an overweight item still runs alone
    assert model.batches[1:] == [["aaaa", "bbbb"], ["cccc", "d", "e"], ["f", "g"], ["hhhhhhhhhhhh"]]
    await batcher.aclose()


async def test_a_full_queue_refuses_at_once():
    model = SlowModel()
    model.gate.clear()
    batcher = Batcher(model, max_batch=1, max_queue=2)
    running = asyncio.create_task(batcher.submit("run"))
    await asyncio.sleep(0.05)
    waiting = [asyncio.create_task(batcher.submit(x)) for x in ("q1", "q2")]
    await asyncio.sleep(0.01)
    with pytest.raises(BatcherFull):
        await batcher.submit("one too many")
    assert batcher.stats.refused == 1
    model.gate.set()
    assert await running == "RUN" and await asyncio.gather(*waiting) == ["Q1", "Q2"]
    await batcher.aclose()


async def test_a_cancelled_request_is_left_out_of_its_batch():
    model = SlowModel()
    model.gate.clear()
    batcher = Batcher(model, max_batch=8)
    blocker = asyncio.create_task(batcher.submit("first"))
    await asyncio.sleep(0.05)
    gone = asyncio.create_task(batcher.submit("gone"))
    kept = asyncio.create_task(batcher.submit("kept"))
    await asyncio.sleep(0.01)
    gone.cancel()
    model.gate.set()
    await blocker
    assert await kept == "KEPT"
    assert model.batches == [["first"], ["kept"]]
    await batcher.aclose()


async def test_a_failing_batch_fails_its_requests_only():
    model = SlowModel(fail_on="bad")
    model.gate.clear()
    batcher = Batcher(model, max_batch=8)
    blocker = asyncio.create_task(batcher.submit("ok"))
    await asyncio.sleep(0.05)
    doomed = [asyncio.create_task(batcher.submit(x)) for x in ("bad", "neighbour")]
    await asyncio.sleep(0.01)
    model.gate.set()
    assert await blocker == "OK"
    for task in doomed:
        with pytest.raises(RuntimeError, match="model broke"):
            await task
    assert await batcher.submit("later") == "LATER"
    assert batcher.stats.failed_batches == 1
    await batcher.aclose()


async def test_wrong_result_count_is_an_error():
    batcher = Batcher(lambda items: items[:-1], max_batch=4)
    with pytest.raises(RuntimeError, match="gave 0 results"):
        await batcher.submit("x")
    await batcher.aclose()


async def test_close_fails_waiting_requests_and_refuses_new_ones():
    model = SlowModel()
    model.gate.clear()
    batcher = Batcher(model, max_batch=1)
    running = asyncio.create_task(batcher.submit("running"))
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(batcher.submit("waiting"))
    await asyncio.sleep(0.01)
    await batcher.aclose()
    model.gate.set()
    for task in (running, waiting):
        with pytest.raises(BatcherClosed):
            await task
    with pytest.raises(BatcherClosed):
        await batcher.submit("after")


def test_bad_limits_are_rejected():
    with pytest.raises(ValueError):
        Batcher(lambda items: items, max_batch=0)
    with pytest.raises(ValueError):
        Batcher(lambda items: items, max_weight=0)


def test_a_batcher_serves_one_loop_then_another():
    batcher = Batcher(lambda items: [i * 2 for i in items], max_batch=4)
    assert asyncio.run(batcher.submit(2)) == 4
    assert asyncio.run(batcher.submit(5)) == 10  # a new event loop (a new worker)
    asyncio.run(batcher.aclose())
