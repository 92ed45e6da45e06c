"""The engine's scheduling policy, without an engine: admission, ranking, bounded wait, the way out."""

from __future__ import annotations

import numpy as np
import pytest

from tts_engine.budget import BackendLimits, StepBudget
from tts_engine.request import ChunkCredit, EngineRequest, RequestStatus
from tts_engine.scheduler import Scheduler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_request(req_id: str, sample_rate: int = 16000) -> EngineRequest:
    return EngineRequest(
        req_id=req_id, text="hello", voice="v", speed=1.0, output_rate=sample_rate,
        stream=None, credit=ChunkCredit(),  # type: ignore[arg-type] - the scheduler never touches the stream
    )  # fmt: skip


def produce(request: EngineRequest, *, samples: int, consumed: int = 0, chunks: int = 1) -> None:
    """Pretend the engine delivered ``chunks`` chunks of ``samples`` in all; the consumer read ``consumed``."""
    request.num_chunks += chunks
    request.credit.num_produced += chunks
    request.credit.samples_produced += samples
    request.credit.samples_consumed += consumed
    request.credit.num_consumed += chunks if consumed >= samples else 0


def make_scheduler(
    capacity: int | None = None, *, max_batch_size: int = 8, **options
) -> tuple[Scheduler, Clock, BackendLimits]:
    """A scheduler for a backend that declares ``capacity`` streams (None: no limit)."""
    clock = Clock()
    limits = BackendLimits(max_streams=capacity, max_batch_size=max_batch_size)
    options.setdefault("max_buffered_chunks", 4)
    return Scheduler(limits=limits, clock=clock, **options), clock, limits


def ids(requests: list[EngineRequest]) -> list[str]:
    return [r.req_id for r in requests]


def test_first_chunks_go_first_then_least_slack() -> None:
    scheduler, clock, _ = make_scheduler()
    requests = {name: make_request(name) for name in ("ahead", "dry", "new_a", "new_b", "middle")}
    for request in requests.values():
        scheduler.add_request(request)
        clock.now += 1
    scheduler.schedule()
    produce(requests["ahead"], samples=3 * 16000)  # 3 s unread
    produce(requests["dry"], samples=16000, consumed=16000 - 800)  # 0.05 s left
    produce(requests["middle"], samples=16000, consumed=0)  # 1 s unread
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == ["new_a", "new_b", "dry", "middle", "ahead"]


def test_audio_queued_ahead_counts_as_slack() -> None:
    """A session's look-ahead sentence waits behind the audio still to play before it."""
    scheduler, clock, _ = make_scheduler()
    lookahead = make_request("lookahead")
    other_first = make_request("other_first")
    running = make_request("running")
    for request in (lookahead, other_first, running):
        scheduler.add_request(request)
        clock.now += 1
    lookahead.credit.ahead = (2.5, clock.now)
    scheduler.schedule()
    produce(running, samples=16000, consumed=16000 - 4800)  # 0.3 s unread
    assert scheduler.get_slack(lookahead) == pytest.approx(2.5)
    assert ids(scheduler.schedule().scheduled) == ["other_first", "running", "lookahead"]
    clock.now += 1.0  # the value decays at real time: 1.5 s still play before it
    assert scheduler.get_slack(lookahead) == pytest.approx(1.5)
    lookahead.credit.ahead = (0.0, clock.now)  # the earlier sentence has played out: a first chunk again
    assert ids(scheduler.schedule().scheduled) == ["lookahead", "other_first", "running"]


def test_the_playback_credit_decays_to_nothing_and_never_below() -> None:
    scheduler, clock, _ = make_scheduler()
    request = make_request("r")
    scheduler.add_request(request)
    request.credit.ahead = (0.5, clock.now)
    clock.now += 0.2
    assert scheduler.get_slack(request) == pytest.approx(0.3)
    clock.now += 5
    assert scheduler.get_slack(request) == 0.0


@pytest.mark.parametrize("hint", [float("nan"), float("inf"), -4.0, "soon", None])
def test_a_bad_playback_ahead_value_counts_as_nothing_ahead(hint) -> None:
    scheduler, _, _ = make_scheduler()
    request = make_request("r")
    request.credit.set_ahead(hint)
    scheduler.add_request(request)
    assert ids(scheduler.schedule().scheduled) == ["r"]
    assert scheduler.get_slack(request) == 0.0


def test_slack_is_in_seconds_at_each_streams_rate() -> None:
    scheduler, _, _ = make_scheduler()
    slow, fast = make_request("slow", 8000), make_request("fast", 48000)
    for request in (slow, fast):
        scheduler.add_request(request)
    scheduler.schedule()
    produce(slow, samples=8000)  # 1 s at 8 kHz
    produce(fast, samples=24000)  # 0.5 s at 48 kHz, although more samples
    assert scheduler.get_slack(fast) == pytest.approx(0.5)
    assert ids(scheduler.schedule().scheduled) == ["fast", "slow"]


def test_backpressured_requests_keep_their_capacity_but_do_not_run() -> None:
    scheduler, _, _ = make_scheduler(max_buffered_chunks=2)
    parked, busy = make_request("parked"), make_request("busy")
    scheduler.add_request(parked)
    scheduler.add_request(busy)
    scheduler.schedule()
    produce(parked, samples=100, chunks=2)  # two unread chunks: at the bound
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == ["busy"]
    assert ids(scheduler.running) == ["parked", "busy"]


def test_the_batch_is_capped_at_max_batch_size() -> None:
    scheduler, _, _ = make_scheduler(max_batch_size=3)
    for i in range(5):
        scheduler.add_request(make_request(f"r{i}"))
    assert ids(scheduler.schedule().scheduled) == ["r0", "r1", "r2"]


def test_admission_is_fifo_against_the_backends_capacity() -> None:
    scheduler, _, _ = make_scheduler(capacity=2)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}"))
    plan = scheduler.schedule()
    assert ids(plan.new_requests) == ["r0", "r1"]
    assert ids(plan.scheduled) == ["r0", "r1"]
    assert ids(scheduler.waiting) == ["r2", "r3"]
    assert ids(scheduler.schedule().new_requests) == []
    assert scheduler.stats["capacity_free"] == 0
    scheduler.finish_requests(["r0"], RequestStatus.FINISHED_STOPPED)  # its capacity comes back at once
    plan = scheduler.schedule()
    assert ids(plan.new_requests) == ["r2"]
    assert ids(scheduler.waiting) == ["r3"]


def test_no_work_when_everything_is_parked_or_waiting_for_capacity() -> None:
    scheduler, _, _ = make_scheduler(capacity=1, max_buffered_chunks=1)
    first, second = make_request("first"), make_request("second")
    scheduler.add_request(first)
    scheduler.add_request(second)
    scheduler.schedule()
    produce(first, samples=10)  # parked at the bound, holding the only slot
    assert not scheduler.has_work()  # the engine thread may block: nothing to spin on
    assert scheduler.get_wait_timeout() is None  # no bounded wait configured
    assert scheduler.schedule().scheduled == []


def test_a_request_waiting_too_long_times_out_and_the_timeout_bounds_the_block() -> None:
    scheduler, clock, _ = make_scheduler(capacity=1, max_queue_wait_s=2.0)
    holder, late = make_request("holder"), make_request("late")
    scheduler.add_request(holder)
    scheduler.schedule()
    clock.now += 0.5
    scheduler.add_request(late)
    produce(holder, samples=10, chunks=4)  # parked
    assert not scheduler.has_work()
    assert scheduler.get_wait_timeout() == pytest.approx(2.0)
    clock.now += 1.0
    assert scheduler.schedule().timed_out_req_ids == []
    clock.now += 1.0
    assert scheduler.has_work()
    plan = scheduler.schedule()
    assert plan.timed_out_req_ids == ["late"]
    assert list(scheduler.waiting) == []
    assert scheduler.stats["requests_timed_out"] == 1


def test_finish_requests_is_the_one_way_out() -> None:
    scheduler, _, _ = make_scheduler(capacity=1)
    running, waiting = make_request("running"), make_request("waiting")
    scheduler.add_request(running)
    scheduler.add_request(waiting)
    scheduler.schedule()
    finished = scheduler.finish_requests(["running", "waiting", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert ids(finished) == ["running", "waiting"]
    assert all(r.status == RequestStatus.FINISHED_ABORTED for r in finished)
    assert scheduler.requests == {} and scheduler.running == [] and list(scheduler.waiting) == []
    assert scheduler.finish_requests(["running"], RequestStatus.FINISHED_FAILED) == []
    assert running.status == RequestStatus.FINISHED_ABORTED
    with pytest.raises(ValueError, match="finished status"):
        scheduler.finish_requests(["x"], RequestStatus.RUNNING)


def test_update_from_output_sorts_results_and_skips_requests_finished_during_the_step() -> None:
    scheduler, _, _ = make_scheduler()
    names = ("audio", "done", "broken", "aborted")
    for name in names:
        scheduler.add_request(make_request(name))
    plan = scheduler.schedule()
    scheduler.finish_requests(["aborted"], RequestStatus.FINISHED_ABORTED)  # arrived mid-step
    error = RuntimeError("boom")
    chunk = np.ones(4, np.float32)
    result = scheduler.update_from_output(plan, [chunk, None, error, chunk])
    assert [(r.req_id, c is chunk) for r, c in result.chunks] == [("audio", True)]
    assert ids(result.stopped) == ["done"]
    assert [(r.req_id, e) for r, e in result.failed] == [("broken", error)]
    with pytest.raises(ValueError, match="outputs"):
        scheduler.update_from_output(plan, [chunk])


def test_stats_count_waiting_running_and_batch_sizes() -> None:
    scheduler, _, _ = make_scheduler(capacity=3, max_batch_size=2)
    for i in range(5):
        scheduler.add_request(make_request(f"r{i}"))
    plan = scheduler.schedule()
    scheduler.update_from_output(plan, [np.zeros(1, np.float32)] * plan.num_scheduled)
    stats = scheduler.stats
    assert (stats["waiting"], stats["running"], stats["last_batch_size"]) == (2, 3, 2)
    assert stats["steps_batch_le_1"] == 0 and stats["steps_batch_le_2"] == 1
    assert stats["mean_batch_size"] == 2.0


def test_bad_settings_raise() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        BackendLimits(max_batch_size=0)
    for name in ("max_streams", "max_prefill_rows", "max_hop_rows"):
        for bad in (0, -1, True):
            with pytest.raises(ValueError, match=name):
                BackendLimits(**{name: bad})
    with pytest.raises(ValueError, match="max_queue_wait_s"):
        Scheduler(limits=BackendLimits(max_batch_size=1), max_buffered_chunks=1, max_queue_wait_s=0)


def test_every_plan_carries_the_declared_row_budget() -> None:
    scheduler, _, _ = make_scheduler()
    scheduler.add_request(make_request("r"))
    assert scheduler.schedule().budget == StepBudget()  # no caps declared: none handed out
    limits = BackendLimits(max_streams=4, max_batch_size=4, max_prefill_rows=2, max_hop_rows=3)
    capped = Scheduler(limits=limits, max_buffered_chunks=4)
    for i in range(3):
        capped.add_request(make_request(f"r{i}"))
    plan = capped.schedule()
    assert plan.budget == StepBudget(prefill_rows=2, hop_rows=3) and plan.budget.is_capped
    assert ids(plan.scheduled) == ["r0", "r1", "r2"]  # the budget caps rows inside the step, not the batch


def test_the_scheduler_is_the_one_capacity_count() -> None:
    """Capacity is freed the moment a request leaves by any way out, and counted for nothing else."""
    scheduler, _, _ = make_scheduler(capacity=2, max_buffered_chunks=1)
    for i in range(5):
        scheduler.add_request(make_request(f"r{i}"))
    assert ids(scheduler.schedule().new_requests) == ["r0", "r1"]
    produce(scheduler.requests["r0"], samples=10)  # parked: it keeps its capacity
    assert not scheduler.can_admit() and scheduler.num_free == 0
    assert ids(scheduler.schedule().new_requests) == []
    scheduler.finish_requests(["r0"], RequestStatus.FINISHED_ABORTED)
    scheduler.finish_requests(["r3"], RequestStatus.FINISHED_ABORTED)  # a waiting one frees nothing
    assert scheduler.num_free == 1
    assert ids(scheduler.schedule().new_requests) == ["r2"]
    scheduler.finish_requests(["r1", "r2"], RequestStatus.FINISHED_FAILED)
    assert ids(scheduler.schedule().new_requests) == ["r4"]
    assert scheduler.stats["capacity"] == 2 and scheduler.stats["capacity_free"] == 1


def test_the_step_budget_takes_rows_in_rank_order() -> None:
    rows = ["least_slack", "middle", "ahead"]
    assert StepBudget.take(rows, None) == (rows, 0)
    assert StepBudget.take(rows, 5) == (rows, 0)
    assert StepBudget.take(rows, 2) == (["least_slack", "middle"], 1)
