"""The engine's scheduling policy: which requests hold backend capacity, and which run each step.

The scheduler owns every unfinished request (``requests``), a FIFO ``waiting`` queue of requests that
hold no backend capacity yet, and the ``running`` list of admitted ones. It never calls the model: the
engine thread asks ``schedule()`` for a ``StepPlan``, runs the backend on it, and hands the results to
``update_from_output()``. ``finish_requests()`` is the one way out.

Capacity: the backend declares its limits once (``BackendLimits``, tts_engine/budget.py); the scheduler
is the one counter against them. A request takes one of ``max_streams`` (for CosyVoice, one KV cache
slot) when it is admitted and keeps it until it finishes, so an admitted request never stalls for want
of a slot. Requests that cannot be admitted wait in FIFO order; one that has waited
``max_queue_wait_s`` is reported in ``StepPlan.timed_out_req_ids`` and the engine fails it with
``EngineOverloaded``. Each plan carries the step's row budget (``StepPlan.budget``: streams that may
prefill, flow + vocoder hop rows), which the backend obeys in the plan's order.

Ranking by playback slack: slack is the audio a request has produced that its consumer has not read
yet, in seconds, plus the consumer's audio queued ahead of the request (``ChunkCredit.ahead``, a value
the consumer sets and the engine decays at real time: a session's next sentence waits behind the rest
of the current one). Least slack goes first; on a tie
(typically zero) a request that has not produced its first chunk goes first, then the oldest. So a
first chunk, or a stream about to run dry, goes before a stream that is seconds ahead. Slack matters
wherever a step has less room than work: the batch cap here, and the step budget's row caps, which
the backend serves in the order given. A request whose consumer holds ``max_buffered_chunks`` unread chunks is not
runnable (backpressure) but keeps its capacity.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tts_engine.budget import BackendLimits, StepBudget
from tts_engine.request import EngineRequest, RequestStatus

logger = logging.getLogger(__name__)

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(slots=True)
class StepPlan:
    """What one engine step does; every list is in run order."""

    new_requests: list[EngineRequest] = field(default_factory=list)  # admitted now: open their streams
    scheduled: list[EngineRequest] = field(default_factory=list)  # the batch: ranked by slack, capped
    timed_out_req_ids: list[str] = field(default_factory=list)  # waited past max_queue_wait_s
    budget: StepBudget = field(default_factory=StepBudget)  # row caps the backend obeys this step

    @property
    def num_scheduled(self) -> int:
        return len(self.scheduled)


@dataclass(slots=True)
class StepResult:
    """One step's outputs sorted by what the engine must do with them (finished requests left out)."""

    chunks: list[tuple[EngineRequest, Any]] = field(default_factory=list)  # audio to post-process
    stopped: list[EngineRequest] = field(default_factory=list)  # the backend finished them: flush
    failed: list[tuple[EngineRequest, BaseException]] = field(default_factory=list)


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
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.last_batch_size = 0
        self.max_batch_size_seen = 0
        self.num_steps = 0
        self.num_scheduled_total = 0
        self.num_timed_out = 0
        self.batch_size_counts = dict.fromkeys(BATCH_SIZE_BUCKETS, 0)  # steps with batch size <= bucket

    # -- in ------------------------------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        request.arrival_time = self._clock()
        self.requests[request.req_id] = request
        self.waiting.append(request)

    # -- queries -------------------------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def can_admit(self, num: int = 1) -> bool:
        """``num`` more requests fit next to the running ones (the one capacity count)."""
        return self.capacity is None or len(self.running) + num <= self.capacity

    @property
    def num_free(self) -> int | None:
        """Requests that could be admitted now (None: no limit)."""
        return None if self.capacity is None else max(0, self.capacity - len(self.running))

    def has_work(self) -> bool:
        """A step now would do something: admit, time out, or run a request."""
        if self.waiting and (self.can_admit(1) or self._expired_head()):
            return True
        return any(self._is_runnable(r) for r in self.running)

    def get_wait_timeout(self) -> float | None:
        """Seconds until the oldest waiting request times out (None: nothing to wait for)."""
        if not self.waiting or self.max_queue_wait_s is None:
            return None
        return max(0.0, self.waiting[0].arrival_time + self.max_queue_wait_s - self._clock())

    def get_slack(self, request: EngineRequest) -> float:
        """Seconds of audio produced for ``request`` and not yet read by its consumer, plus the
        consumer's audio queued ahead of it."""
        credit = request.credit
        slack = max(0, credit.samples_produced - credit.samples_consumed) / request.output_rate
        return slack + self._ahead(request)

    def _ahead(self, request: EngineRequest) -> float:
        """The listener's playback credit, a value set by the loop and decayed at real time."""
        return request.credit.ahead_at(self._clock())

    def _is_runnable(self, request: EngineRequest) -> bool:
        return request.credit.get_num_buffered() < self.max_buffered_chunks

    def _expired_head(self) -> bool:
        timeout = self.get_wait_timeout()
        return timeout is not None and timeout <= 0

    # -- one step ------------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Time out, admit (FIFO, while capacity is free), rank the runnable ones, hand out the budget."""
        plan = StepPlan(budget=self._budget)
        if self.max_queue_wait_s is not None:
            deadline = self._clock() - self.max_queue_wait_s
            while self.waiting and self.waiting[0].arrival_time <= deadline:
                plan.timed_out_req_ids.append(self.waiting.popleft().req_id)
            self.num_timed_out += len(plan.timed_out_req_ids)
        while self.waiting and self.can_admit(1):
            request = self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.new_requests.append(request)
        runnable = [r for r in self.running if self._is_runnable(r)]
        slack = {id(r): self.get_slack(r) for r in runnable}
        runnable.sort(key=lambda r: (slack[id(r)], r.num_chunks > 0, r.arrival_time))
        plan.scheduled = runnable[: self.max_batch_size]
        return plan

    def update_from_output(self, plan: StepPlan, outputs: list[Any]) -> StepResult:
        """Sort the backend's per-request outputs; requests finished meanwhile (aborts) are skipped."""
        if len(outputs) != len(plan.scheduled):
            raise ValueError(f"{len(outputs)} outputs for {len(plan.scheduled)} scheduled requests")
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
        """The one way out: mark, take off both queues in one pass, return what was still unfinished."""
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
            self.waiting = deque(r for r in self.waiting if id(r) not in gone)
            self.running = [r for r in self.running if id(r) not in gone]
        return finished

    # -- stats ---------------------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int | float]:
        stats: dict[str, int | float] = {
            "waiting": len(self.waiting),
            "running": len(self.running),
            "runnable": sum(self._is_runnable(r) for r in self.running),
            "last_batch_size": self.last_batch_size,
            "max_batch_size_seen": self.max_batch_size_seen,
            "mean_batch_size": self.num_scheduled_total / self.num_steps if self.num_steps else 0.0,
            "requests_timed_out": self.num_timed_out,
        }
        if self.capacity is not None:  # the one capacity count (None: the backend declares no limit)
            stats["capacity"] = self.capacity
            stats["capacity_free"] = self.capacity - len(self.running)
        for bucket, count in self.batch_size_counts.items():
            stats[f"steps_batch_le_{bucket}"] = count
        return stats
