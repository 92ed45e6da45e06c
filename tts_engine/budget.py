"""What a backend can hold and do per step (``BackendLimits``), and one step's share of it (``StepBudget``).

A backend declares its limits once (``Backend.limits()``); the ``Scheduler`` owns the count against
them: how many streams are open (admission), how many run in one step (the batch), and the rows of
the step's heavier parts, which it hands to the backend in ``StepPlan.budget``. The backend obeys the
budget it is given and keeps no admission counter of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """Flow + vocoder rows this step: the first ready hops in rank order."""

    @property
    def is_capped(self) -> bool:
        return self.prefill_rows is not None or self.hop_rows is not None

    @staticmethod
    def take(items: list, cap: int | None) -> tuple[list, int]:
        """The first ``cap`` items and how many were left for a later step."""
        if cap is None or len(items) <= cap:
            return items, 0
        return items[:cap], len(items) - cap


UNCAPPED = StepBudget()
