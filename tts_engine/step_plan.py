"""What one engine step does (``StepPlan``, made by the scheduler) and what came of it (``StepResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tts_engine.budget import StepBudget
from tts_engine.request import EngineRequest


@dataclass(slots=True)
class StepPlan:
    """What one engine step does; every list is in run order."""

    new_requests: list[EngineRequest] = field(default_factory=list)  # admitted now: open their streams
    scheduled: list[EngineRequest] = field(default_factory=list)  # the batch: ranked, capped
    timed_out_req_ids: list[str] = field(default_factory=list)  # waited past max_queue_wait_s
    budget: StepBudget = field(default_factory=StepBudget)  # row caps and lanes the backend obeys
    parked: list[EngineRequest] = field(default_factory=list)  # batch requests that give up their capacity
    unparked: list[EngineRequest] = field(default_factory=list)  # parked ones that take it back

    @property
    def num_scheduled(self) -> int:
        return len(self.scheduled)


@dataclass(slots=True)
class StepResult:
    """One step's outputs sorted by what the engine must do with them (finished requests left out)."""

    chunks: list[tuple[EngineRequest, Any]] = field(default_factory=list)  # audio to post-process
    stopped: list[EngineRequest] = field(default_factory=list)  # the backend finished them: flush
    failed: list[tuple[EngineRequest, BaseException]] = field(default_factory=list)
