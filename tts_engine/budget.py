"""What a backend can hold and do per step (``BackendLimits``), and one step's share of it (``StepBudget``).

A backend declares its limits once (``Backend.limits()``); the ``Scheduler`` owns the count against
them: how many streams are open (admission), how many run in one step (the batch), and the rows of
the step's heavier parts, which it hands to the backend in ``StepPlan.budget``. The backend obeys the
budget it is given and keeps no admission counter of its own.

``StepBudget.lanes`` says, per stream of the step, when its flow + vocoder work may run (``Lane``): the
scheduler sets it from each stream's playback slack and class; a backend that splits a step's audio
work (CosyVoice, tts_engine/backends/cosyvoice/step.py) runs the urgent lane first and hands its audio
out before the rest (the short lane next, then the comfortable one), and leaves the held work for a
later step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum


class Lane(IntEnum):
    """When a stream's flow + vocoder work runs in a step (streams without a lane: ``URGENT``)."""

    URGENT = 0
    """Its listener waits for audio (first audio, or a playback lead shorter than a step may take): its
    hops run first and their audio is handed out before any other hop of the step runs."""
    SHORT = 1
    """A short playback lead, but longer than a step may take: its hops and closing pass run right after
    the urgent audio is out, in the same step, whoever waits."""
    COMFORTABLE = 2
    """A comfortable playback lead: its first hop runs with the urgent ones; its later hops and its
    closing pass run after their audio is out, in the same step."""
    DEFERRED = 3
    """A comfortable lead while another listener waits for first audio: as COMFORTABLE, but its later
    hops and closing pass wait until the step's openings are out (CosyVoice's
    ``deferred_after_openings``; without it, or while an opening could not run, for a later step)."""
    BACKGROUND = 4
    """A batch stream while a listener waits for first audio: none of its hops run this step."""


def _check_cap(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class BackendLimits:
    """A backend's capacity, declared once. ``None``: no limit."""

    max_streams: int | None = None
    """Streams open at once (CosyVoice: KV cache slots); an admitted stream holds one until it closes."""
    max_batch_size: int = 32
    """Streams advanced by one ``step()`` call."""
    max_prefill_rows: int | None = None
    """Streams that may start a prefill (a new LLM segment) in one step; the rest wait a step."""
    max_hop_rows: int | None = None
    """Rows of one step's flow + vocoder batch; the hops of the other streams wait a step."""
    splits_steps: bool = False
    """``step()`` takes the budget's ``lanes`` and an ``on_chunks`` callback: it runs a step's audio work
    urgent lane first and hands that audio out before the rest (tts_engine/backends/base.py)."""
    can_park: bool = False
    """``Backend.park()`` releases a stream's share of ``max_streams`` keeping its state (CosyVoice: its
    KV cache to host memory), so a batch stream can make room for a higher class."""

    def __post_init__(self) -> None:
        for name in ("max_streams", "max_prefill_rows", "max_hop_rows"):
            _check_cap(name, getattr(self, name))
        _check_cap("max_batch_size", self.max_batch_size)

    def step_budget(self) -> StepBudget:
        """The per-step budget these limits allow (what a backend stepped without a scheduler obeys)."""
        return StepBudget(prefill_rows=self.max_prefill_rows, hop_rows=self.max_hop_rows)


@dataclass(frozen=True, slots=True)
class StepBudget:
    """One step's row budget, in the step's stream order (least slack first). ``None``: no cap."""

    prefill_rows: int | None = None
    """Streams that may prefill this step: the first ones in rank order that need it."""
    hop_rows: int | None = None
    """Flow + vocoder rows this step: the first ready hops in rank order (held ones not counted)."""
    lanes: tuple[Lane, ...] | None = None
    """Per stream of the step, in its order: when its flow + vocoder work runs (None: all urgent)."""
    slack: tuple[float, ...] | None = None
    """Per stream of the step, in its order: its playback slack in seconds when the step was planned
    (None: not known); a backend may let an urgent hop with slack to spare wait for an opening hop."""

    @property
    def is_capped(self) -> bool:
        """The budget says something a backend must obey (caps, or lanes)."""
        return self.prefill_rows is not None or self.hop_rows is not None or self.lanes is not None

    def lane(self, index: int) -> Lane:
        """The lane of the step's stream ``index`` (URGENT without lanes)."""
        return Lane.URGENT if self.lanes is None else self.lanes[index]

    def only(self, keep: Sequence[bool]) -> StepBudget:
        """This budget for the step's streams whose ``keep`` is true (the others left before it ran)."""

        def kept(values: tuple | None) -> tuple | None:
            return None if values is None else tuple(v for v, k in zip(values, keep, strict=True) if k)

        return replace(self, lanes=kept(self.lanes), slack=kept(self.slack))

    @staticmethod
    def take(items: list, cap: int | None) -> tuple[list, int]:
        """The first ``cap`` items and how many were left for a later step."""
        if cap is None or len(items) <= cap:
            return items, 0
        return items[:cap], len(items) - cap


UNCAPPED = StepBudget()
