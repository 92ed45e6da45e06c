"""Priority classes and lanes in the engine's scheduler, without an engine (tts_engine/scheduler.py)."""

from __future__ import annotations

import pytest

from tests.test_scheduler import Clock, ids, make_request, produce
from tts_engine.arguments import check_priority
from tts_engine.budget import BackendLimits, Lane, StepBudget
from tts_engine.request import EngineRequest, RequestStatus
from tts_engine.scheduler import LONG_STEP_RANK, MIN_COMFORT_S, MIN_CRITICAL_S, Scheduler


def request(req_id: str, priority: str = "interactive") -> EngineRequest:
    made = make_request(req_id)
    made.priority = priority  # type: ignore[assignment]
    return made


def scheduler_for(capacity: int | None, *, can_park: bool = True, splits_steps: bool = False, **options):
    clock = Clock()
    limits = BackendLimits(
        max_streams=capacity, max_batch_size=8, can_park=can_park, splits_steps=splits_steps
    )
    options.setdefault("max_buffered_chunks", 4)
    return Scheduler(limits=limits, clock=clock, **options), clock


def admit(scheduler: Scheduler):
    """One plan; the requests it admits get a (stand-in) backend stream, as the engine opens them."""
    plan = scheduler.schedule()
    for admitted in plan.new_requests:
        admitted.backend_stream = object()  # type: ignore[assignment]
    return plan


def test_admission_takes_the_highest_class_first_fifo_within() -> None:
    scheduler, clock = scheduler_for(2)
    for name, priority in (("b1", "batch"), ("i1", "interactive"), ("d1", "device"), ("i2", "interactive")):
        scheduler.add_request(request(name, priority))
        clock.now += 1
    assert ids(scheduler.waiting) == ["d1", "i1", "i2", "b1"]
    assert ids(admit(scheduler).new_requests) == ["d1", "i1"]
    scheduler.finish_requests(["d1"], RequestStatus.FINISHED_STOPPED)
    assert ids(admit(scheduler).new_requests) == ["i2"]


def test_ranking_is_by_class_then_slack() -> None:
    scheduler, clock = scheduler_for(None)
    names = {"batch_dry": "batch", "interactive_dry": "interactive", "device_ahead": "device"}
    for name, priority in names.items():
        scheduler.add_request(request(name, priority))
        clock.now += 1
    scheduler.schedule()
    produce(scheduler.requests["device_ahead"], samples=5 * 16000)  # 5 s unread: plenty of slack
    assert ids(scheduler.schedule().scheduled) == ["device_ahead", "interactive_dry", "batch_dry"]


def test_a_batch_request_takes_only_capacity_nobody_else_waits_for_and_yields_it_by_parking() -> None:
    scheduler, clock = scheduler_for(2)
    for i in range(3):
        scheduler.add_request(request(f"b{i}", "batch"))
        clock.now += 1
    assert ids(admit(scheduler).new_requests) == ["b0", "b1"]  # the free capacity, no more
    scheduler.add_request(request("d", "device"))
    plan = admit(scheduler)
    assert ids(plan.parked) == ["b1"]  # the most recently admitted batch request gives its slot up
    assert ids(plan.new_requests) == ["d"] and ids(scheduler.running) == ["b0", "d"]
    assert "b1" not in ids(plan.scheduled) and scheduler.requests["b1"].parked
    scheduler.add_request(request("i", "interactive"))
    plan = admit(scheduler)
    assert ids(plan.parked) == ["b0"] and ids(plan.new_requests) == ["i"]
    assert ids(scheduler.schedule().scheduled) == ["d", "i"]  # parked ones do not run
    # Capacity comes back: the parked ones resume, oldest first, before a new batch request starts.
    scheduler.finish_requests(["d", "i"], RequestStatus.FINISHED_STOPPED)
    plan = admit(scheduler)
    assert ids(plan.unparked) == ["b0", "b1"] and plan.new_requests == [] and ids(scheduler.waiting) == ["b2"]
    assert scheduler.stats["batch_parks_total"] == 2 and scheduler.stats["batch_parked"] == 0


def test_without_parking_a_batch_request_leaves_one_slot_free_for_the_others() -> None:
    scheduler, clock = scheduler_for(3, can_park=False)
    for i in range(3):
        scheduler.add_request(request(f"b{i}", "batch"))
    assert ids(admit(scheduler).new_requests) == ["b0", "b1"]
    scheduler.add_request(request("d", "device"))
    plan = admit(scheduler)
    assert plan.parked == [] and ids(plan.new_requests) == ["d"]


def test_only_device_and_interactive_waits_are_bounded() -> None:
    scheduler, clock = scheduler_for(1, max_queue_wait_s=2.0)
    scheduler.add_request(request("holder"))
    admit(scheduler)
    scheduler.add_request(request("batch", "batch"))
    scheduler.add_request(request("late", "interactive"))
    assert scheduler.get_wait_timeout() == pytest.approx(2.0)
    clock.now += 3
    assert admit(scheduler).timed_out_req_ids == ["late"]
    assert ids(scheduler.waiting) == ["batch"] and scheduler.get_wait_timeout() is None


def test_lanes_hold_comfortable_work_and_batch_while_a_listener_waits_for_first_audio() -> None:
    scheduler, clock = scheduler_for(None, splits_steps=True)
    for name, priority in (("playing", "device"), ("ahead", "device"), ("batch", "batch")):
        scheduler.add_request(request(name, priority))
    scheduler.schedule()
    produce(scheduler.requests["playing"], samples=1600)  # 0.1 s unread: short of audio
    produce(scheduler.requests["ahead"], samples=5 * 16000)  # 5 s unread: comfortable
    produce(scheduler.requests["batch"], samples=1600)
    plan = scheduler.schedule()
    lanes = dict(zip(ids(plan.scheduled), plan.budget.lanes or (), strict=True))
    assert lanes == {"playing": Lane.URGENT, "ahead": Lane.COMFORTABLE, "batch": Lane.COMFORTABLE}
    slack = dict(zip(ids(plan.scheduled), plan.budget.slack or (), strict=True))  # each stream's, in seconds
    assert slack == {"playing": pytest.approx(0.1), "ahead": pytest.approx(5.0), "batch": pytest.approx(0.1)}
    scheduler.add_request(request("new", "interactive"))  # a listener waiting for its first audio
    plan = scheduler.schedule()
    lanes = dict(zip(ids(plan.scheduled), plan.budget.lanes or (), strict=True))
    assert lanes == {
        "playing": Lane.URGENT, "ahead": Lane.DEFERRED, "new": Lane.URGENT, "batch": Lane.BACKGROUND
    }  # fmt: skip
    assert scheduler.comfortable_s == MIN_COMFORT_S  # no step measured yet
    clock.now += 2.0  # a step of 2 s: 'comfortable' now means 4 such steps of audio
    scheduler.update_from_output(plan, [None] * plan.num_scheduled)
    assert scheduler.comfortable_s == pytest.approx(8.0)
    assert scheduler.critical_s == pytest.approx(2.0)  # a lead under one such step cannot wait for the urgent work
    plan = scheduler.schedule()
    lanes = dict(zip(ids(plan.scheduled), plan.budget.lanes or (), strict=True))
    assert lanes["ahead"] == Lane.SHORT and lanes["playing"] == Lane.URGENT  # 5 s: short of 8 s, over 2 s
    scheduler.requests["ahead"].credit.samples_consumed += int(3.5 * 16000)  # 1.5 s left: under one step
    plan = scheduler.schedule()
    assert dict(zip(ids(plan.scheduled), plan.budget.lanes or (), strict=True))["ahead"] == Lane.URGENT


def test_the_lanes_long_step_measure_can_ignore_one_long_step() -> None:
    """With ``long_step_rank`` 4 the lanes' measure is the 4th longest recent step: one step stretched to
    3 s among short ones leaves a 1 s lead comfortable; four such steps make it urgent. With the default
    (the longest) one does."""
    scheduler, clock = scheduler_for(None, splits_steps=True)
    assert scheduler.long_step_rank == LONG_STEP_RANK == 1
    scheduler.long_step_rank = 4
    scheduler.add_request(request("playing", "device"))
    scheduler.schedule()
    produce(scheduler.requests["playing"], samples=16000)  # 1 s unread

    def step(seconds: float) -> Lane:
        plan = scheduler.schedule()
        clock.now += seconds
        scheduler.update_from_output(plan, [None] * plan.num_scheduled)
        return scheduler.schedule().budget.lane(0)

    for _ in range(8):
        step(0.05)
    assert step(3.0) == Lane.COMFORTABLE  # 1 s of lead: over the 0.6 s minimum, the 3 s step ignored
    assert scheduler.critical_s == pytest.approx(MIN_CRITICAL_S) and scheduler.comfortable_s == MIN_COMFORT_S
    for _ in range(2):
        step(3.0)
    assert step(3.0) == Lane.URGENT and scheduler.critical_s == pytest.approx(3.0)
    scheduler.long_step_rank = LONG_STEP_RANK  # the longest: one long step is enough
    for _ in range(40):
        step(0.05)
    assert step(3.0) == Lane.URGENT


def test_a_budget_for_the_streams_left_in_a_step_keeps_their_lanes_and_slack() -> None:
    """A request that fails as the step opens leaves it: the others keep their own lanes and slack."""
    budget = StepBudget(hop_rows=2, lanes=(Lane.URGENT, Lane.SHORT, Lane.COMFORTABLE), slack=(0.1, 0.5, 3.0))
    kept = budget.only([True, False, True])
    assert kept.lanes == (Lane.URGENT, Lane.COMFORTABLE) and kept.slack == (0.1, 3.0) and kept.hop_rows == 2
    assert StepBudget().only([True, False]) == StepBudget()
    with pytest.raises(ValueError):
        budget.only([True])  # one answer per stream


def test_a_backend_that_does_not_split_steps_gets_no_lanes() -> None:
    scheduler, _ = scheduler_for(None)
    scheduler.add_request(request("r"))
    assert scheduler.schedule().budget.lanes is None


@pytest.mark.parametrize("bad", ["urgent", "", None, 1, "Device"])
def test_an_unknown_priority_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="priority must be one of device, interactive, batch"):
        check_priority(bad)
    assert check_priority("batch") == "batch"


class _Stream:
    """A stand-in backend stream that says whether it still needs its unit of capacity."""

    def __init__(self) -> None:
        self.holds_capacity = True


def test_a_stream_that_needs_its_capacity_no_more_lets_a_waiting_request_in() -> None:
    scheduler, _ = scheduler_for(2)
    for name in ("a", "b", "c"):
        scheduler.add_request(request(name))
    plan = scheduler.schedule()
    assert ids(plan.new_requests) == ["a", "b"] and ids(scheduler.waiting) == ["c"]
    streams = {}
    for admitted in plan.new_requests:
        admitted.backend_stream = streams.setdefault(admitted.req_id, _Stream())  # type: ignore[assignment]
    assert ids(scheduler.schedule().new_requests) == []  # both hold theirs: c waits
    streams["a"].holds_capacity = False  # e.g. its LLM finished: its remaining hops need no KV slot
    plan = scheduler.schedule()
    assert ids(plan.new_requests) == ["c"] and len(scheduler.running) == 3
    assert scheduler.stats["capacity_free"] == 0 and scheduler.stats["running_past_capacity"] == 1


def test_running_requests_stay_under_a_multiple_of_the_capacity() -> None:
    from tts_engine.scheduler import RUNNING_PER_UNIT

    scheduler, _ = scheduler_for(1)
    for k in range(RUNNING_PER_UNIT + 2):
        scheduler.add_request(request(f"r{k}"))
    for _ in range(RUNNING_PER_UNIT + 2):
        for admitted in scheduler.schedule().new_requests:
            stream = _Stream()
            stream.holds_capacity = False  # none holds: only the bound stops admission
            admitted.backend_stream = stream  # type: ignore[assignment]
    assert len(scheduler.running) == RUNNING_PER_UNIT and len(scheduler.waiting) == 2
