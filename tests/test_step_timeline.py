"""The steps' timeline (tts_engine/backends/cosyvoice/timeline.py): what a benchmark's ``--explain`` reads
to say where a slow first chunk waited. Off in a server; with one, every call of a step is a span
inside the step's own."""

from __future__ import annotations

import re

from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from tests.test_first_audio_bursts import make_backend, model, playing_and_newcomer, voices  # noqa: F401
from tts_engine.backends.cosyvoice.timeline import Span, Timeline, explain
from tts_engine.budget import Lane, StepBudget


def test_a_step_records_each_of_its_calls_inside_its_own_span(model: CosyVoice3, voices: VoiceStore) -> None:  # noqa: F811
    backend = make_backend(model, voices, burst=32)
    assert backend.stepper.timeline is None  # a server records nothing
    playing, newcomer = playing_and_newcomer(backend)
    timeline = backend.stepper.timeline = Timeline()
    backend.step([newcomer, playing], StepBudget(lanes=(Lane.URGENT, Lane.URGENT)))
    spans = list(timeline.spans)
    [step] = [s for s in spans if s.kind == "step"]
    assert step.rows == 2 and step.detail == "URGENT 2"
    inner = [s for s in spans if s.kind != "step"]
    assert all(step.start <= s.start <= s.end <= step.end for s in inner)
    kinds = [s.kind for s in inner]
    assert kinds[:2] == ["llm", "burst"]  # the one-token step, then the newcomer's opening tokens
    burst = inner[1]
    iterations = int(re.match(r"(\d+) iterations", burst.detail).group(1))  # type: ignore[union-attr]
    assert iterations >= 20  # 25 opening tokens + look-ahead, less its prefill's
    calls = [s for s in inner if s.kind in ("flow", "closing")]
    assert calls[0].kind == "flow" and calls[0].detail == "O1"  # the newcomer's opening hop first, alone
    # then the playing stream's next hop; or, where its LLM ended meanwhile (the catch-ups decode for a
    # time, so how far it got depends on the machine), its closing pass, whole, in the urgent group's call
    assert [(s.kind, s.detail) for s in calls[1:]] in ([("flow", "H1")], [("flow", "C1")])
    assert inner[-1].kind == "catch-up"  # and the running LLMs' catch-up after the flow work
    for stream in (playing, newcomer):
        stream.close()


def test_explain_adds_up_the_wait_by_kind_and_outside_steps() -> None:
    timeline = Timeline()
    timeline.spans.extend([
        Span(0.00, 0.50, "step", 3, "URGENT 3"),
        Span(0.03, 0.08, "llm", 3),
        Span(0.10, 0.30, "flow", 3, "O1 H2"),
        Span(0.30, 0.35, "burst", 1, "28 iterations, 40 rows"),
        Span(0.55, 0.58, "step", 1, "URGENT 1"),
        Span(0.55, 0.58, "flow", 1, "O1"),
        Span(0.90, 1.00, "step", 1, "URGENT 1"),  # after the first chunk: not counted
    ])  # fmt: skip
    summary, *calls = explain(timeline, requested_at=0.05, arrived_at=0.60)
    # 550 ms: 450 + 30 inside two steps; flow 200 + 30, burst 50, llm 30 of its 50 (clipped); 70 outside
    assert summary == "550 ms: 2 steps (480 ms; flow 230, burst 50, llm 30), outside steps 70 ms"
    assert calls == [
        "      -20 ms     50 ms llm rows 3",
        "      +50 ms    200 ms flow rows 3 O1 H2",
        "     +250 ms     50 ms burst rows 1 28 iterations, 40 rows",
        "     +500 ms     30 ms flow rows 1 O1",
    ]
    assert explain(timeline, 0.05, 0.60, lines=1)[1:] == ["      +50 ms    200 ms flow rows 3 O1 H2"]


def test_a_timeline_keeps_at_most_its_limit() -> None:
    timeline = Timeline(limit=3)
    for k in range(5):
        with timeline.span("flow", k):
            pass
    assert [s.rows for s in timeline.spans] == [2, 3, 4]
    synced: list[int] = []
    timeline = Timeline(sync=lambda: synced.append(1))
    with timeline.span("flow", 1, lambda: "O1"):
        pass
    assert synced == [1] and timeline.spans[0].detail == "O1"
