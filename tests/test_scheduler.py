"""The engine's scheduling policy, without an engine: admission, ranking, bounded wait, the way out."""

from __future__ import annotations

import numpy as np
import pytest

from tts_engine.request import ChunkCredit, EngineRequest, RequestStatus
from tts_engine.scheduler import Scheduler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_request(req_id: str, sample_rate: int = 16000) -> EngineRequest:
    return EngineRequest(
        req_id=req_id, text="hello", voice="v", speed=1.0, sample_rate=sample_rate,
        stream=None, credit=ChunkCredit(),  # type: ignore[arg-type] - the scheduler never touches the stream
    )  # fmt: skip


def produce(request: EngineRequest, *, samples: int, consumed: int = 0, chunks: int = 1) -> None:
    """Pretend the engine delivered ``chunks`` chunks of ``samples`` in all; the consumer read ``consumed``."""
    request.num_chunks += chunks
    request.credit.num_produced += chunks
    request.credit.samples_produced += samples
    request.credit.samples_consumed += consumed
    request.credit.num_consumed += chunks if consumed >= samples else 0


def make_scheduler(capacity: int | None = None, **options) -> tuple[Scheduler, Clock, list[int]]:
    clock = Clock()
    open_count = [0]

    def can_admit(num: int) -> bool:
        return capacity is None or open_count[0] + num <= capacity

    options.setdefault("max_batch_size", 8)
    options.setdefault("max_buffered_chunks", 4)
    return Scheduler(can_admit=can_admit, clock=clock, **options), clock, open_count


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
    queued = [2.5]
    lookahead = make_request("lookahead")
    lookahead.playback_ahead = lambda: queued[0]
    other_first = make_request("other_first")
    running = make_request("running")
    for request in (lookahead, other_first, running):
        scheduler.add_request(request)
        clock.now += 1
    scheduler.schedule()
    produce(running, samples=16000, consumed=16000 - 4800)  # 0.3 s unread
    assert scheduler.get_slack(lookahead) == pytest.approx(2.5)
    assert ids(scheduler.schedule().scheduled) == ["other_first", "running", "lookahead"]
    queued[0] = 0.0  # the earlier sentence has played out: the look-ahead is a first chunk again
    assert ids(scheduler.schedule().scheduled) == ["lookahead", "other_first", "running"]


@pytest.mark.parametrize("hint", [float("nan"), -4.0, "soon", None])
def test_a_bad_playback_ahead_hint_counts_as_nothing_ahead(hint) -> None:
    scheduler, _, _ = make_scheduler()
    request = make_request("r")

    def ahead() -> float:
        if hint is None:
            raise RuntimeError("consumer went away")
        return hint  # type: ignore[return-value]

    request.playback_ahead = ahead
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
    scheduler, _, open_count = make_scheduler(capacity=2)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}"))
    plan = scheduler.schedule()
    assert ids(plan.new_requests) == ["r0", "r1"]
    assert ids(plan.scheduled) == ["r0", "r1"]
    assert ids(scheduler.waiting) == ["r2", "r3"]
    open_count[0] = 2
    assert ids(scheduler.schedule().new_requests) == []
    scheduler.finish_requests(["r0"], RequestStatus.FINISHED_STOPPED)
    open_count[0] = 1
    plan = scheduler.schedule()
    assert ids(plan.new_requests) == ["r2"]
    assert ids(scheduler.waiting) == ["r3"]


def test_no_work_when_everything_is_parked_or_waiting_for_capacity() -> None:
    scheduler, _, open_count = make_scheduler(capacity=1, max_buffered_chunks=1)
    first, second = make_request("first"), make_request("second")
    scheduler.add_request(first)
    scheduler.add_request(second)
    scheduler.schedule()
    open_count[0] = 1
    produce(first, samples=10)  # parked at the bound, holding the only slot
    assert not scheduler.has_work()  # the engine thread may block: nothing to spin on
    assert scheduler.get_wait_timeout() is None  # no bounded wait configured
    assert scheduler.schedule().scheduled == []


def test_a_request_waiting_too_long_times_out_and_the_timeout_bounds_the_block() -> None:
    scheduler, clock, open_count = make_scheduler(capacity=1, max_queue_wait_s=2.0)
    holder, late = make_request("holder"), make_request("late")
    scheduler.add_request(holder)
    scheduler.schedule()
    open_count[0] = 1
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
        Scheduler(max_batch_size=0, max_buffered_chunks=1)
    with pytest.raises(ValueError, match="max_queue_wait_s"):
        Scheduler(max_batch_size=1, max_buffered_chunks=1, max_queue_wait_s=0)
