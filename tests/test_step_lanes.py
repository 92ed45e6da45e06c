"""When a deferred stream's audio work runs (tiny CosyVoice model; issue 25): its later hop runs once the
step's openings are out, unless one of them could not run this step.

Stepped by hand with the lanes the scheduler would give; counted in hand-outs and samples, not seconds.
"""

from __future__ import annotations

import pytest

from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from tests.test_first_audio_bursts import _samples, make_backend, model, playing_and_newcomer, voices
from tts_engine.budget import Lane, StepBudget

__all__ = ["model", "voices"]  # the fixtures


@pytest.mark.parametrize("after_openings", [True, False])
def test_a_deferred_hop_runs_once_the_steps_openings_are_out(
    model: CosyVoice3, voices: VoiceStore, after_openings: bool
) -> None:
    """A newcomer waits for first audio, so a playing stream with a comfortable lead is deferred. Its hop
    runs in the same step once the newcomer's opening is out (``deferred_after_openings``, the default),
    after that audio was handed out; without it, the hop waits for a later step."""
    backend = make_backend(model, voices, burst=32)
    assert backend.stepper.deferred_after_openings
    backend.stepper.deferred_after_openings = after_openings
    playing, newcomer = playing_and_newcomer(backend)
    held = backend.step_stats()["hops_held"]
    closing_seconds = backend.stepper.seconds["closing"]  # grows only while a closing slice runs
    handouts: list[list[int]] = []
    budget = StepBudget(lanes=(Lane.URGENT, Lane.DEFERRED))
    out = backend.step([newcomer, playing], budget, lambda items: handouts.append(sorted(i for i, _ in items)))
    assert handouts[0] == [0]  # the newcomer's opening went out first
    # its next call is a hop (audio now) or, if its LLM ended during the catch-ups, its exact closing
    # pass, which the comfortable lane runs a slice a step (begun now, audio in a later step)
    ran = _samples(out[1]) > 0 or backend.stepper.seconds["closing"] > closing_seconds
    if after_openings:
        assert ran and backend.step_stats()["hops_held"] == held
    else:
        assert not ran and backend.step_stats()["hops_held"] == held + 1
        assert playing.next_job() is not None
    for stream in (playing, newcomer):
        stream.close()


def test_a_deferred_hop_waits_while_an_opening_of_the_step_could_not_run(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    """A newcomer that could not prefill this step (the budget's ``prefill_rows`` spent) still waits for
    first audio at the step's end: the deferred hop waits for a later step."""
    backend = make_backend(model, voices, burst=32)
    playing, newcomer = playing_and_newcomer(backend)
    held = backend.step_stats()["hops_held"]
    out = backend.step([newcomer, playing], StepBudget(prefill_rows=0, lanes=(Lane.URGENT, Lane.DEFERRED)))
    assert _samples(out[0]) == _samples(out[1]) == 0 and newcomer.awaits_opening
    assert backend.step_stats()["hops_held"] == held + 1
    for stream in (playing, newcomer):
        stream.close()
