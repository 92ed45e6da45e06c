"""On a CPU an urgent hop whose listener still has audio to spare runs after the step's opening hops, and a
request that arrives before it runs ends the step first (tts_engine/backends/cosyvoice/step.py,
``_can_wait``); an urgent exact closing pass with audio to spare leaves its rest for the next step when a
request arrives between two of its slices (urgent_calls.py, ``_pause``). Steps, slices and hand-out order
are checked, not seconds: the call-cost estimates are set."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from tests.test_first_audio_bursts import (  # noqa: F401
    PLAYING,
    _to_end,
    _until_closing,
    make_backend,
    model,
    playing_and_newcomer,
    voices,
)
from tts_engine.backends.cosyvoice import CosyVoiceBackend
from tts_engine.backends.cosyvoice.timeline import Timeline
from tts_engine.budget import Lane, StepBudget

COST_S = 0.05  # the estimate of an opening call and of an urgent call: a wait costs 0.1 s (0.15 s at margin 2)


def _estimates(backend: CosyVoiceBackend, seconds: float | None) -> None:
    for kind in ("opening", "urgent"):
        backend.stepper.call_seconds[kind].clear()
        if seconds is not None:
            backend.stepper.call_seconds[kind].append(seconds)


@pytest.mark.parametrize(
    ("slack_s", "cost_s", "margin", "order"),
    [
        (30.0, COST_S, 1.0, [[1], [0]]),  # slack to spare: the newcomer's opening first
        (0.1, COST_S, 1.0, [[0], [1]]),  # 0.1 s cannot cover 0.1 s and the step so far: rank order
        (30.0, None, 1.0, [[0], [1]]),  # no call measured yet: rank order
        # 1 s calls: 2.5 s covers its own call and one opening (2 s and the step so far), not two (3 s)
        (2.5, 1.0, 1.0, [[1], [0]]),
        (2.5, 1.0, 2.0, [[0], [1]]),
    ],
)
def test_an_urgent_hop_with_slack_to_spare_runs_after_the_opening(
    model: CosyVoice3,  # noqa: F811
    voices: VoiceStore,  # noqa: F811
    slack_s: float,
    cost_s: float | None,
    margin: float,
    order: list[list[int]],
) -> None:
    backend = make_backend(model, voices, burst=32)
    assert backend.stepper.rows_cost  # the tests run on a CPU
    backend.stepper.wait_margin = margin
    playing, newcomer = playing_and_newcomer(backend)
    _estimates(backend, cost_s)
    handouts: list[list[int]] = []
    # the playing stream ranks first: the newcomer is a reply's next sentence, the current one still plays
    budget = StepBudget(lanes=(Lane.URGENT, Lane.URGENT), slack=(slack_s, slack_s + 1.0))
    out = backend.step([playing, newcomer], budget, lambda items: handouts.append(sorted(i for i, _ in items)))
    assert handouts == order and all(o.size == 0 for o in out)  # all the audio went out mid-step
    assert backend.step_stats()["urgent_waits"] == (1 if order == [[1], [0]] else 0)
    for stream in (playing, newcomer):
        stream.close()


@pytest.mark.parametrize("slack_s", [30.0, 0.1])
def test_a_request_arriving_before_the_waiting_hop_runs_ends_the_step(
    model: CosyVoice3,  # noqa: F811
    voices: VoiceStore,  # noqa: F811
    slack_s: float,
) -> None:
    """With slack to spare for one more opening the waiting hop leaves the step to the newcomer (it runs
    next step); with too little it runs before the step ends, as every urgent hop does."""
    backend = make_backend(model, voices, burst=32)
    backend.stepper.bursts_yield = False  # the request arrives after the newcomer's burst
    playing, newcomer = playing_and_newcomer(backend)
    _estimates(backend, COST_S)
    handouts: list[list[int]] = []
    budget = StepBudget(lanes=(Lane.URGENT, Lane.URGENT), slack=(slack_s, 30.0))
    yielded = backend.step_stats()["steps_yielded"]
    backend.step([playing, newcomer], budget, lambda items: handouts.append(sorted(i for i, _ in items)), lambda: True)
    assert backend.step_stats()["steps_yielded"] == yielded + 1  # ended early either way (no short lane ran)
    if slack_s > 1.0:
        assert handouts == [[1]] and playing.next_job() is not None  # its hop waits for the next step
        backend.step([playing, newcomer], budget, lambda items: handouts.append(sorted(i for i, _ in items)))
        assert handouts == [[1], [0]]
    else:
        assert handouts == [[0], [1]]
    for stream in (playing, newcomer):
        stream.close()


@pytest.mark.parametrize(
    ("slack_s", "pauses", "precheck"), [(30.0, True, True), (0.1, True, True), (0.1, True, False), (30.0, False, True)]
)
def test_an_urgent_closing_pass_with_slack_to_spare_leaves_its_rest_for_the_next_step(
    model: CosyVoice3,  # noqa: F811
    voices: VoiceStore,  # noqa: F811
    slack_s: float,
    pauses: bool,
    precheck: bool,
) -> None:
    """A request arrives once the urgent closing pass has begun. With slack to spare for the newcomer's
    opening the pass stops after its first slice and ends in a later step, its audio the same bit for bit
    as run whole; with too little slack, or ``urgent_closing_pauses`` off, it runs to its end in its step:
    a slice at a time, or with ``urgent_pause_precheck`` (too little slack even as it begins) in one
    batched flow call."""
    backend = make_backend(model, voices, burst=32)
    whole: list = []
    reference = backend.open_stream(PLAYING[1], "default", 1.0)
    _until_closing(backend, reference, whole)
    _to_end(backend, reference, whole, Lane.URGENT)
    reference.close()

    backend.stepper.urgent_closing_pauses = pauses
    backend.stepper.urgent_pause_precheck = precheck
    chunks: list = []
    stream = backend.open_stream(PLAYING[1], "default", 1.0)  # the same text and seed: the same tokens
    _until_closing(backend, stream, chunks)
    _estimates(backend, COST_S)
    before = backend.step_stats()
    urgent = StepBudget(lanes=(Lane.URGENT,), slack=(slack_s,))
    backend.stepper.timeline = timeline = Timeline()
    [out] = backend.step([stream], urgent, None, lambda: id(stream) in backend.stepper.under_way)
    backend.stepper.timeline = None
    after = backend.step_stats()
    waits = pauses and slack_s > 1.0
    sliced = pauses and (waits or not precheck)
    assert [span.detail for span in timeline.spans if span.kind == "flow"] == ([] if sliced else ["C1"])
    assert sum(span.kind == "closing" for span in timeline.spans) == int(sliced)
    assert after["urgent_pauses"] - before["urgent_pauses"] == int(waits)
    assert after["steps_yielded"] - before["steps_yielded"] == int(waits)  # one step, counted once
    assert (id(stream) in backend.stepper.under_way) == waits
    assert (np.asarray(out).size == 0) == waits  # paused: no audio yet; else the closing pass's audio
    if waits:
        assert after["closing_pauses"] == before["closing_pauses"] + 1
    chunks.append(np.asarray(out))
    _to_end(backend, stream, chunks, Lane.URGENT)
    assert id(stream) not in backend.stepper.under_way
    assert np.array_equal(np.concatenate(chunks), np.concatenate(whole))
    stream.close()
