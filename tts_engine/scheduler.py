"""The engine's scheduling policy: which requests hold backend capacity, and which run each step.

The scheduler owns every unfinished request (``requests``), one FIFO queue per priority class of the
requests that hold no backend capacity yet (``waiting``, highest class first), the ``running`` list of
admitted ones and the ``parked`` batch requests. It never calls the model: the engine thread asks
``schedule()`` for a ``StepPlan``, runs the backend on it, and hands the results to
``update_from_output()``. ``finish_requests()`` is the one way out.

Capacity: the backend declares its limits once (``BackendLimits``, tts_engine/budget.py); the scheduler
is the one counter against them. A request takes one of ``max_streams`` (for CosyVoice, one KV cache
slot) when it is admitted and keeps it until it finishes, is parked, or its backend stream says it needs
it no more (``BackendStream.holds_capacity``: a CosyVoice stream whose last LLM has finished, whose
remaining hops play out over seconds while a newcomer takes the slot), so a running request never
stalls for want of a slot. Running requests stay under ``RUNNING_PER_UNIT`` times the capacity. Requests that cannot be admitted wait; a device or interactive request that has
waited ``max_queue_wait_s`` is reported in ``StepPlan.timed_out_req_ids`` and the engine fails it with
``EngineOverloaded`` (batch requests wait as long as it takes: their caller owns that deadline). Each
plan carries the step's row budget (``StepPlan.budget``: streams that may prefill, flow + vocoder hop
rows, and each stream's ``Lane``), which the backend obeys in the plan's order.

Priority classes (``EngineRequest.priority``; tts_engine/interface.py): ``device`` first, then
``interactive``, then ``batch``. Admission takes the highest class first (FIFO within a class). A batch
request is admitted only into capacity nobody of a higher class is waiting for; when a device or
interactive request waits and nothing is free, the most recently admitted running batch request is
parked at this step boundary (``StepPlan.parked``: the backend releases its capacity and keeps its
state, ``Backend.park()``) and resumes (``StepPlan.unparked``) once capacity is free again and no higher
class waits, before any new batch request is admitted. A backend that cannot park never gets its last
free slot taken by a batch request (one is kept for the other classes).

Ranking: by class, then by playback slack. Slack is the audio a request has produced that its consumer
has not read yet, in seconds, plus the consumer's audio queued ahead of the request
(``ChunkCredit.ahead``, a value the consumer sets and the engine decays at real time: a session's next
sentence waits behind the rest of the current one, a playing sentence counts what the listener still
has buffered). Least slack goes first; on a tie (typically zero) a request that has not produced its
first chunk goes first, then the oldest. Slack matters wherever a step has less room than work: the
batch cap here, and the step budget's row caps, which the backend serves in the order given. A request
whose consumer holds ``max_buffered_chunks`` unread chunks is not runnable (backpressure) but keeps its
capacity.

Lanes (for a backend that ``splits_steps``): a stream whose slack is under ``critical_s`` (a long recent
step: the ``LONG_STEP_RANK``-th longest of the last ``STEP_WINDOW``, at least ``MIN_CRITICAL_S``) is
``URGENT``: its audio work runs first in the step, with every opening hop, and is handed out before the
rest runs. One under ``comfortable_s`` (below) is ``SHORT``: its work runs right after that audio is
out, in the same step (so a newcomer's first audio does not wait for it, and it never waits more than a
step). A stream with more slack is ``COMFORTABLE``: its later hops and closing pass run after the urgent
audio is out; while some device or interactive listener waits for its first audio, such work waits
until that audio is out (``DEFERRED``: the backend runs it after the step's openings, or in a later
step) and batch streams do no audio work at all (``BACKGROUND``), so first audio never waits behind
work that could wait. ``comfortable_s`` is ``COMFORT_STEPS`` times that long step, at least
``MIN_COMFORT_S``: held work runs while its listener still has that much audio, so it is back in an
urgent lane, and done, before it runs dry. The long step is the longest (``long_step_rank`` 1): one step
stretched by the machine or by a pile of closing passes makes most streams urgent for ``STEP_WINDOW``
steps, whose urgent work goes first and can make more long steps; the 4th longest cut the 0.9 tail in
an A/B but added underruns at 0.6 in two (docs/step-order.md).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tts_engine.budget import BackendLimits, Lane, StepBudget
from tts_engine.interface import PRIORITIES
from tts_engine.request import EngineRequest, RequestStatus
from tts_engine.step_plan import StepPlan, StepResult

logger = logging.getLogger(__name__)

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MIN_COMFORT_S = 0.6  # a playback lead below this is always short: its stream's work is urgent
COMFORT_STEPS = 4.0  # ... and so is one below this many long recent steps (LONG_STEP_RANK)
MIN_CRITICAL_S = 0.2  # a playback lead below this is critical: its work runs with the first audio of a step
CRITICAL_STEPS = 1.0  # ... and so is one below this many long recent steps
RUNNING_PER_UNIT = 4  # running requests at most this many times the capacity (those past it hold none)
STEP_WINDOW = 32  # steps whose durations set that measure
LONG_STEP_RANK = 1  # ... which is the longest of them (the 4th longest: fewer underruns at 0.9, more at 0.6)


class Scheduler:
    """Admission, ranking and bookkeeping; used by the engine thread only."""

    def __init__(
        self,
        *,
        limits: BackendLimits,
        max_buffered_chunks: int,
        max_queue_wait_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queue_wait_s is not None and max_queue_wait_s <= 0:
            raise ValueError(f"max_queue_wait_s must be positive or None, got {max_queue_wait_s}")
        self.limits = limits
        self.max_batch_size = limits.max_batch_size
        self.capacity = limits.max_streams  # streams admitted at once (None: no limit)
        self.max_buffered_chunks = max_buffered_chunks
        self.max_queue_wait_s = max_queue_wait_s
        self._budget = limits.step_budget()
        self._clock = clock
        self.requests: dict[str, EngineRequest] = {}
        self._queues: dict[str, deque[EngineRequest]] = {name: deque() for name in PRIORITIES}
        self.running: list[EngineRequest] = []
        self.parked: list[EngineRequest] = []  # batch requests that gave their capacity up, oldest first
        self.num_step_calls = 0  # schedule() calls: the engine's step clock (requests note it)
        self._step_started: float | None = None
        self._step_seconds: deque[float] = deque(maxlen=STEP_WINDOW)
        self.long_step_rank = LONG_STEP_RANK  # the recent steps' measure: 1 the longest, 2 the second ...
        self.last_batch_size = 0
        self.max_batch_size_seen = 0
        self.num_steps = 0
        self.num_scheduled_total = 0
        self.num_timed_out = 0
        self.num_parks = 0
        self.num_held_steps = 0  # steps that held some stream's audio work for a later step
        self.batch_size_counts = dict.fromkeys(BATCH_SIZE_BUCKETS, 0)  # steps with batch size <= bucket

    # -- in ------------------------------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        request.arrival_time = self._clock()
        request.arrival_step = self.num_step_calls
        self.requests[request.req_id] = request
        self._queues[request.priority].append(request)

    # -- queries -------------------------------------------------------------------------------------

    @property
    def waiting(self) -> list[EngineRequest]:
        """Requests that hold no capacity yet, in admission order (highest class first, FIFO within)."""
        return [r for name in PRIORITIES for r in self._queues[name]]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def num_holding(self) -> int:
        """Running requests that hold a unit of capacity (admitted ones not yet opened count)."""
        return sum(1 for r in self.running if _holds(r))

    def can_admit(self, num: int = 1) -> bool:
        """``num`` more requests fit next to the running ones (the one capacity count)."""
        return self.num_free is None or num <= self.num_free

    @property
    def num_free(self) -> int | None:
        """Requests that could be admitted now (None: no limit)."""
        if self.capacity is None:
            return None
        return max(0, min(self.capacity - self.num_holding(), RUNNING_PER_UNIT * self.capacity - len(self.running)))

    def has_work(self) -> bool:
        """A step now would do something: admit, park, resume, time out, or run a request."""
        if self._expired_head() or self._next_admission() is not None:
            return True
        return any(self._is_runnable(r) for r in self.running)

    def get_wait_timeout(self) -> float | None:
        """Seconds until the oldest bounded waiting request times out (None: nothing to wait for)."""
        if self.max_queue_wait_s is None:
            return None
        heads = [queue[0].arrival_time for name, queue in self._queues.items() if queue and name != "batch"]
        if not heads:
            return None
        return max(0.0, min(heads) + self.max_queue_wait_s - self._clock())

    def get_slack(self, request: EngineRequest) -> float:
        """Seconds of audio produced for ``request`` and not yet read by its consumer, plus the
        consumer's audio queued ahead of it."""
        credit = request.credit
        slack = max(0, credit.samples_produced - credit.samples_consumed) / request.output_rate
        return slack + self._ahead(request)

    @property
    def comfortable_s(self) -> float:
        """The playback lead above which a stream's later hops and closing pass may wait (see above)."""
        return max(MIN_COMFORT_S, COMFORT_STEPS * self._long_step())

    @property
    def critical_s(self) -> float:
        """The playback lead below which a stream's work cannot wait for the rest of a step's urgent work."""
        return min(self.comfortable_s, max(MIN_CRITICAL_S, CRITICAL_STEPS * self._long_step()))

    def _long_step(self) -> float:
        """The ``long_step_rank``-th longest of the last ``STEP_WINDOW`` steps (the shortest if fewer)."""
        steps = sorted(self._step_seconds, reverse=True)
        return steps[min(self.long_step_rank, len(steps)) - 1] if steps else 0.0

    def _ahead(self, request: EngineRequest) -> float:
        """The listener's playback credit, a value set by the loop and decayed at real time."""
        return request.credit.ahead_at(self._clock())

    def _is_runnable(self, request: EngineRequest) -> bool:
        return request.credit.get_num_buffered() < self.max_buffered_chunks

    def _expired_head(self) -> bool:
        timeout = self.get_wait_timeout()
        return timeout is not None and timeout <= 0

    # -- admission -----------------------------------------------------------------------------------

    def _next_admission(self) -> EngineRequest | None:
        """The request admission would take next (a waiting one, or a parked one to resume), if it can:
        the highest class first; a batch request only into free capacity nobody else waits for."""
        for name in PRIORITIES[:-1]:
            queue = self._queues[name]
            if queue:
                return queue[0] if self.can_admit(1) or self._park_candidate() is not None else None
        if not self._batch_fits():
            return None
        if self.parked:
            return self.parked[0]
        queue = self._queues["batch"]
        return queue[0] if queue else None

    def _batch_fits(self) -> bool:
        """A batch request may take a unit of capacity now (one stays free unless the backend can park)."""
        if self.capacity is None:
            return True
        reserve = 0 if self.limits.can_park or self.capacity == 1 else 1
        free = self.num_free
        return free is not None and 1 + reserve <= free

    def _park_candidate(self) -> EngineRequest | None:
        """The running batch request to park for a higher class: the most recently admitted one."""
        if not self.limits.can_park:
            return None
        batch = [r for r in self.running if r.is_batch and r.backend_stream is not None and _holds(r)]
        return max(batch, key=lambda r: r.arrival_time) if batch else None

    def _admit(self, plan: StepPlan) -> None:
        while (request := self._next_admission()) is not None:
            if not self.can_admit(1):  # a higher class waits for capacity a batch request holds
                victim = self._park_candidate()
                if victim is None:
                    return
                self.running.remove(victim)
                victim.parked = True
                self.parked.append(victim)
                self.parked.sort(key=lambda r: r.arrival_time)
                plan.parked.append(victim)
                self.num_parks += 1
                continue
            if request.parked:
                self.parked.remove(request)
                request.parked = False
                if request in plan.parked:  # parked and resumed in one plan: nothing happens to it
                    plan.parked.remove(request)
                else:
                    plan.unparked.append(request)
            else:
                self._queues[request.priority].popleft()
                request.status = RequestStatus.RUNNING
                plan.new_requests.append(request)
            self.running.append(request)

    # -- one step ------------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Time out, admit (and park or resume batch requests), rank the runnable ones, hand out the
        budget."""
        now = self._clock()
        self.num_step_calls += 1
        self._step_started = now
        plan = StepPlan(budget=self._budget)
        if self.max_queue_wait_s is not None:
            deadline = now - self.max_queue_wait_s
            for name in PRIORITIES[:-1]:
                queue = self._queues[name]
                while queue and queue[0].arrival_time <= deadline:
                    plan.timed_out_req_ids.append(queue.popleft().req_id)
            self.num_timed_out += len(plan.timed_out_req_ids)
        self._admit(plan)
        runnable = [r for r in self.running if self._is_runnable(r)]
        slack = {id(r): self.get_slack(r) for r in runnable}
        runnable.sort(key=lambda r: (r.rank, slack[id(r)], r.num_chunks > 0, r.arrival_time))
        plan.scheduled = runnable[: self.max_batch_size]
        if self.limits.splits_steps and plan.scheduled:
            plan.budget = self._with_lanes(plan.scheduled, slack)
        return plan

    def _with_lanes(self, scheduled: list[EngineRequest], slack: dict[int, float]) -> StepBudget:
        comfortable, critical = self.comfortable_s, self.critical_s
        waits_first = any(not r.is_batch and r.num_chunks == 0 for r in scheduled)
        lanes = []
        for request in scheduled:
            if request.is_batch:
                lane = Lane.BACKGROUND if waits_first else Lane.COMFORTABLE
            elif slack[id(request)] < critical:
                lane = Lane.URGENT
            elif slack[id(request)] < comfortable:
                lane = Lane.SHORT
            else:
                lane = Lane.DEFERRED if waits_first else Lane.COMFORTABLE
            lanes.append(lane)
        if waits_first and any(lane >= Lane.DEFERRED for lane in lanes):
            self.num_held_steps += 1
        budget = self._budget
        return StepBudget(
            prefill_rows=budget.prefill_rows,
            hop_rows=budget.hop_rows,
            lanes=tuple(lanes),
            slack=tuple(slack[id(r)] for r in scheduled),
        )

    def update_from_output(self, plan: StepPlan, outputs: list[Any]) -> StepResult:
        """Sort the backend's per-request outputs; requests finished meanwhile (aborts) are skipped."""
        if len(outputs) != len(plan.scheduled):
            raise ValueError(f"{len(outputs)} outputs for {len(plan.scheduled)} scheduled requests")
        if self._step_started is not None:
            self._step_seconds.append(max(0.0, self._clock() - self._step_started))
            self._step_started = None
        self._record_batch(len(plan.scheduled))
        result = StepResult()
        for request, output in zip(plan.scheduled, outputs, strict=True):
            if request.status.is_finished() or request.req_id not in self.requests:
                continue
            if isinstance(output, BaseException):
                result.failed.append((request, output))
            elif output is None:
                result.stopped.append(request)
            else:
                result.chunks.append((request, output))
        return result

    def _record_batch(self, size: int) -> None:
        if size == 0:
            return
        self.num_steps += 1
        self.num_scheduled_total += size
        self.last_batch_size = size
        self.max_batch_size_seen = max(self.max_batch_size_seen, size)
        for bucket in BATCH_SIZE_BUCKETS:
            if size <= bucket:
                self.batch_size_counts[bucket] += 1

    # -- out -----------------------------------------------------------------------------------------

    def finish_requests(self, req_ids: list[str], status: RequestStatus) -> list[EngineRequest]:
        """The one way out: mark, take off every queue in one pass, return what was still unfinished."""
        if not status.is_finished():
            raise ValueError(f"finish_requests needs a finished status, got {status.name}")
        finished: list[EngineRequest] = []
        for req_id in req_ids:
            request = self.requests.pop(req_id, None)
            if request is None or request.status.is_finished():
                continue
            request.status = status
            finished.append(request)
        if finished:
            gone = {id(r) for r in finished}
            for name, queue in self._queues.items():
                if any(id(r) in gone for r in queue):
                    self._queues[name] = deque(r for r in queue if id(r) not in gone)
            self.running = [r for r in self.running if id(r) not in gone]
            self.parked = [r for r in self.parked if id(r) not in gone]
        return finished

    # -- stats ---------------------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int | float]:
        stats: dict[str, int | float] = {
            "waiting": sum(len(queue) for queue in self._queues.values()),
            "running": len(self.running),
            "runnable": sum(self._is_runnable(r) for r in self.running),
            "last_batch_size": self.last_batch_size,
            "max_batch_size_seen": self.max_batch_size_seen,
            "mean_batch_size": self.num_scheduled_total / self.num_steps if self.num_steps else 0.0,
            "requests_timed_out": self.num_timed_out,
            "batch_parked": len(self.parked),
            "batch_parks_total": self.num_parks,
            "steps_holding_audio_work": self.num_held_steps,
        }
        for name, queue in self._queues.items():
            stats[f"waiting_{name}"] = len(queue)
        if self.capacity is not None:  # the one capacity count (None: the backend declares no limit)
            stats["capacity"] = self.capacity
            stats["capacity_free"] = self.num_free or 0
            stats["running_past_capacity"] = len(self.running) - self.num_holding()  # their LLM is done
        for bucket, count in self.batch_size_counts.items():
            stats[f"steps_batch_le_{bucket}"] = count
        return stats


def _holds(request: EngineRequest) -> bool:
    """``request`` holds a unit of capacity (one admitted but not yet opened does)."""
    return getattr(request.backend_stream, "holds_capacity", True)
