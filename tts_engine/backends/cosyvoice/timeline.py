"""What the CosyVoice3 steps ran and when, kept only while a benchmark asks for it.

``BatchedStep.timeline`` is None in a server (no cost beyond one test a call). A benchmark sets a
``Timeline``; each step then records spans: the whole step (``step``), its one-token LLM step
(``llm``), decode bursts (``burst``), the LLM catch-up (``catch-up``), every flow + vocoder call
(``flow``, its rows by kind: O opening, H later hop, C closing), every slice of an exact closing
call (``closing``) and of a hop run in slices (``slice``, its kind: H1). ``explain`` tells what a
waiting listener's first chunk waited behind.
``sync`` (``torch.cuda.synchronize`` on a GPU) runs before each span ends, so a span is the time its
kernels took, not only their launch; it slows the step a little, so only a benchmark sets it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

SPAN_LIMIT = 200_000  # spans kept (the oldest go first): ~40 MB at most, hours of a benchmark's steps


@dataclass(frozen=True)
class Span:
    start: float  # time.monotonic()
    end: float
    kind: str  # step, llm, burst, catch-up, flow, closing, slice
    rows: int  # the call's rows (for a step: its streams)
    detail: str = ""  # flow: rows by kind ("O1 H2 C1"); burst and catch-up: iterations; step: streams by lane


class Timeline:
    """A bounded record of spans (``SPAN_LIMIT``), appended from the engine's thread."""

    def __init__(self, sync: Callable[[], None] | None = None, limit: int = SPAN_LIMIT) -> None:
        self.sync = sync
        self.spans: deque[Span] = deque(maxlen=limit)

    @contextmanager
    def span(self, kind: str, rows: int = 0, detail: Callable[[], str] | str = "") -> Iterator[None]:
        """Record the time the block takes; ``detail`` may be a callable, read when the block ends."""
        start = time.monotonic()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            text = detail() if callable(detail) else detail
            self.spans.append(Span(start, time.monotonic(), kind, rows, text))

    def between(self, start: float, end: float) -> list[Span]:
        """The spans that overlap [start, end], in order of start."""
        return sorted((s for s in list(self.spans) if s.end > start and s.start < end), key=lambda s: s.start)


def explain(timeline: Timeline, requested_at: float, arrived_at: float, lines: int = 12) -> list[str]:
    """What the engine did between a sentence's request and its first chunk: the seconds in each kind of
    span inside steps (clipped to the window), the time outside any step, then the longest spans."""
    window = arrived_at - requested_at
    spans = timeline.between(requested_at, arrived_at)
    inner: dict[str, float] = {}
    in_steps = 0.0
    for span in spans:
        seconds = min(span.end, arrived_at) - max(span.start, requested_at)
        if span.kind == "step":
            in_steps += seconds
        else:
            inner[span.kind] = inner.get(span.kind, 0.0) + seconds
    steps = sum(span.kind == "step" for span in spans)
    parts = [f"{kind} {1000 * seconds:.0f}" for kind, seconds in sorted(inner.items(), key=lambda kv: -kv[1])]
    summary = (
        f"{1000 * window:.0f} ms: {steps} steps ({1000 * in_steps:.0f} ms; "
        f"{', '.join(parts) or 'nothing inside'}), outside steps {1000 * max(0.0, window - in_steps):.0f} ms"
    )
    longest = sorted((s for s in spans if s.kind != "step"), key=lambda s: s.start - s.end)[:lines]
    out = [summary]
    for span in sorted(longest, key=lambda s: s.start):
        out.append(
            f"  {1000 * (span.start - requested_at):+7.0f} ms {1000 * (span.end - span.start):6.0f} ms "
            f"{span.kind} rows {span.rows}{' ' + span.detail if span.detail else ''}"
        )
    return out


def span_of(
    timeline: Timeline | None, kind: str, rows: int = 0, detail: Callable[[], str] | str = ""
) -> AbstractContextManager[None]:
    """``timeline.span(...)``, or a block that records nothing when there is no timeline."""
    return nullcontext() if timeline is None else timeline.span(kind, rows, detail)
