"""On a CPU a flow call costs in proportion to its rows (tiny CosyVoice model; issue 25): a waiting
listener's opening hop runs in a call of its own, and a new request ends the comfortable hops between two
rows and the short lane's exact closing call between two slices (``rows_cost``, ``short_closings_yield``).

Stepped by hand with the lanes the scheduler would give; counted in hand-outs and samples, not seconds.
The fixtures and helpers are tests/test_first_audio_bursts.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from tests.test_first_audio_bursts import (
    NEWCOMER,
    PLAYING,
    _samples,
    _to_end,
    _until_closing,
    make_backend,
    model,
    playing_and_newcomer,
    voices,
)
from tts_engine.backends.cosyvoice import CosyVoiceBackend
from tts_engine.budget import Lane, StepBudget

__all__ = ["model", "voices"]  # the fixtures
ONE_CALL = "好的。"  # given 12 speech tokens below: fewer than the first hop's 28, so its one call is its closing pass


@pytest.mark.parametrize("alone", [True, False])
def test_on_a_cpu_an_opening_hop_goes_out_before_the_urgent_groups_other_rows(
    model: CosyVoice3, voices: VoiceStore, alone: bool
) -> None:
    """A flow call on a CPU costs in proportion to its rows, so a waiting listener's opening hop runs in a
    call of its own and its audio is handed out before the other urgent rows run (``rows_cost``, set
    by the backend for a CPU device); without it, the group is one call and one hand-out."""
    backend = make_backend(model, voices, burst=32)
    assert backend.stepper.rows_cost  # the tests run on a CPU
    backend.stepper.rows_cost = alone
    playing, newcomer = playing_and_newcomer(backend)
    handouts: list[list[int]] = []
    lanes = StepBudget(lanes=(Lane.URGENT, Lane.URGENT))
    # the newcomer ranks first (nothing plays for it: no slack), as the scheduler ranks it
    backend.step([newcomer, playing], lanes, lambda items: handouts.append(sorted(i for i, _ in items)))
    if alone:
        assert handouts == [[0], [1]]  # the newcomer's opening first, alone; then the playing stream's hop
        assert backend.step_stats()["opening_calls"] == 1
    else:
        assert handouts == [[0, 1]]
        assert backend.step_stats()["opening_calls"] == 0
    for stream in (playing, newcomer):
        stream.close()


@pytest.mark.parametrize("per_call", [1, 2, 3])
def test_on_a_cpu_openings_next_to_each_other_share_a_call_up_to_openings_per_call(
    model: CosyVoice3, voices: VoiceStore, per_call: int
) -> None:
    """Three waiting listeners' opening hops that follow each other in rank order go out in calls of at
    most ``openings_per_call`` rows, each call's audio handed out before the next call runs; the playing
    stream's urgent hop, ranked last, runs after them in a call of its own. The audio is the same."""
    backend = make_backend(model, voices, burst=32)
    backend.stepper.openings_per_call = per_call
    playing, first = playing_and_newcomer(backend)
    others = [backend.open_stream(t, "default", 1.0) for t in PLAYING]
    newcomers = [first, *others]
    handouts: list[list[int]] = []
    audio: dict[int, np.ndarray] = {}

    def handout(items: list) -> None:
        handouts.append(sorted(i for i, _ in items))
        audio.update((i, np.asarray(chunk)) for i, chunk in items)

    lanes = StepBudget(lanes=(Lane.URGENT,) * 4)
    before = backend.step_stats()["opening_calls"]
    backend.step([*newcomers, playing], lanes, handout)
    expected = {1: [[0], [1], [2], [3]], 2: [[0, 1], [2], [3]], 3: [[0, 1, 2], [3]]}[per_call]
    assert handouts == expected
    assert backend.step_stats()["opening_calls"] == before + len(expected) - 1
    for stream in [*newcomers, playing]:
        stream.close()
    # each opening's audio is what that sentence's opening is alone: bit for bit from a call of its own;
    # from a shared call up to a batch's float rounding (measured: at most 2e-5 against peaks of 0.06)
    for index, text in enumerate((NEWCOMER, *PLAYING)):
        alone = make_backend(model, voices, burst=32)
        stream = alone.open_stream(text, "default", 1.0)
        out = np.asarray(alone.step([stream], StepBudget(lanes=(Lane.URGENT,)))[0])
        stream.close()
        if per_call == 1:
            assert np.array_equal(out, audio[index])
        else:
            assert out.shape == audio[index].shape and np.allclose(out, audio[index], rtol=0, atol=2e-4)


@pytest.mark.parametrize("cheap_first", [True, False])
def test_on_a_cpu_cached_openings_go_out_before_a_one_call_sentences_exact_pass(
    model: CosyVoice3, voices: VoiceStore, cheap_first: bool
) -> None:
    """A one-call sentence (shorter than the first hop: its only call is the exact closing pass, prompt and
    every token at full attention) ranked ahead of two cached openings: with ``openings_cheap_first`` the
    two go out first in a call of their own and its pass after them; without, the three share one call
    and one hand-out. The audio of each is what it is alone."""

    def backend_of() -> CosyVoiceBackend:
        backend = CosyVoiceBackend(
            model=model, seed=3, max_batch_size=4, max_llm_len=512, voice_cache_dir=voices.cache_dir,
            fixed_llm_tokens=lambda text: 12 if text == ONE_CALL else 120,
        )  # fmt: skip
        for preset in voices.presets():
            backend.add_voice(preset)
        return backend

    backend = backend_of()
    backend.stepper.openings_cheap_first = cheap_first
    streams = [backend.open_stream(t, "default", 1.0) for t in (ONE_CALL, *PLAYING)]
    handouts: list[list[int]] = []
    audio: dict[int, np.ndarray] = {}

    def handout(items: list) -> None:
        handouts.append(sorted(i for i, _ in items))
        audio.update((i, np.asarray(chunk)) for i, chunk in items)

    backend.step(streams, StepBudget(lanes=(Lane.URGENT,) * 3), handout)
    assert handouts == ([[1, 2], [0]] if cheap_first else [[0, 1, 2]])
    assert backend.step_stats()["one_call_openings_after"] == (1 if cheap_first else 0)
    for stream in streams:
        stream.close()
    for index, text in enumerate((ONE_CALL, *PLAYING)):
        alone = backend_of()
        stream = alone.open_stream(text, "default", 1.0)
        out = np.asarray(alone.step([stream], StepBudget(lanes=(Lane.URGENT,)))[0])
        stream.close()
        assert out.size > 0 and out.shape == audio[index].shape
        assert np.allclose(out, audio[index], rtol=0, atol=2e-4)  # a shared call: a batch's float rounding


@pytest.mark.parametrize(("rows_cost", "vocoder_pieces"), [(True, False), (True, True), (False, False)])
def test_on_a_cpu_a_new_request_ends_the_comfortable_hops_between_two_rows(
    model: CosyVoice3, voices: VoiceStore, rows_cost: bool, vocoder_pieces: bool
) -> None:
    """With ``rows_cost`` (a CPU) the comfortable group's hops run a row a call and a request that arrives
    meanwhile ends them between two calls (the rest wait a step); with ``vocoder_pieces`` (a CPU's
    default) it ends the first row's call already between its flow and its vocoder, which ends in the
    next step; in one batch they all run. (Without ``hop_slices``, the default: tests/test_hop_slices.py
    has the calls it makes.)"""
    backend = make_backend(model, voices, burst=32)
    assert backend.stepper.vocoder_pieces == (backend.device.type == "cpu")
    backend.stepper.rows_cost = rows_cost
    backend.stepper.vocoder_pieces = vocoder_pieces
    backend.stepper.hop_slices = False
    streams = [backend.open_stream(t, "default", 1.0) for t in PLAYING]
    both = StepBudget(lanes=(Lane.URGENT, Lane.URGENT))
    started = [False, False]
    for _ in range(50):  # both openings
        out = backend.step(streams, both)
        started = [s or _samples(o) > 0 for s, o in zip(started, out, strict=True)]
        if all(started):
            break
    comfortable = StepBudget(lanes=(Lane.COMFORTABLE, Lane.COMFORTABLE))
    backend.stepper.deferred_after_openings = False  # deferred below: tokens only, whoever waits
    for _ in range(300):  # until both next hops' tokens are there
        for stream in streams:
            stream.feed_tokens()
        if all(stream.next_job() is not None for stream in streams):
            break
        backend.step(streams, StepBudget(lanes=(Lane.DEFERRED, Lane.DEFERRED)))  # tokens only
    assert all(stream.next_job() is not None for stream in streams)
    answers = iter([False, False])  # no request yet after the urgent group nor before the comfortable one

    def arrived() -> bool:
        return next(answers, True)  # ... then one arrives

    yielded = backend.step_stats()["steps_yielded"]
    out = backend.step(streams, comfortable, None, arrived)
    sizes = [_samples(o) for o in out]
    if rows_cost and vocoder_pieces:
        assert sizes == [0, 0]  # the first row's flow ran, its vocoder waits for the next step, as the second row
        assert id(streams[0]) in backend.stepper.under_way and backend.stepper.under_way[id(streams[0])][1].done
        assert backend.step_stats()["steps_yielded"] == yielded + 1 and streams[1].next_job() is not None
        pauses = backend.step_stats()["vocoder_pauses"]
        out = backend.step(streams, comfortable)  # nobody arrives
        assert all(_samples(o) > 0 for o in out) and backend.step_stats()["vocoder_pauses"] == pauses
        assert not backend.stepper.under_way
    elif rows_cost:
        assert sizes[0] > 0 and sizes[1] == 0  # the first row's hop ran; the second waits for the next step
        assert backend.step_stats()["steps_yielded"] == yielded + 1 and streams[1].next_job() is not None
    else:
        assert sizes[0] > 0 and sizes[1] > 0
    for stream in streams:
        stream.close()


@pytest.mark.parametrize("closings_yield", [True, False])
def test_on_a_cpu_a_new_request_ends_a_short_lane_closing_call_between_two_slices(
    model: CosyVoice3, voices: VoiceStore, closings_yield: bool
) -> None:
    """With ``short_closings_yield`` (a CPU's default) the short lane's exact closing call runs a slice of
    Euler steps a call and a request that arrives meanwhile ends it between two slices (the rest runs
    next step, its audio the same bit for bit); without it the call runs whole in its step."""
    backend = make_backend(model, voices, burst=32)
    assert backend.stepper.short_closings_yield == (backend.device.type == "cpu")
    backend.stepper.short_closings_yield = closings_yield
    whole: list[np.ndarray] = []
    reference = backend.open_stream(PLAYING[1], "default", 1.0)
    _until_closing(backend, reference, whole)
    _to_end(backend, reference, whole, Lane.URGENT)  # the closing call whole, in the urgent group
    reference.close()

    chunks: list[np.ndarray] = []
    stream = backend.open_stream(PLAYING[1], "default", 1.0)  # the same text and seed: the same tokens
    _until_closing(backend, stream, chunks)
    answers = iter([False, False])  # no request after the urgent group nor before the first slice ...

    def arrived() -> bool:
        return next(answers, True)  # ... then one arrives

    before = backend.step_stats()
    [out] = backend.step([stream], StepBudget(lanes=(Lane.SHORT,)), None, arrived)
    after = backend.step_stats()
    if closings_yield:
        assert _samples(out) == 0 and stream.next_job() is not None and stream.next_job().finalize
        assert after["steps_yielded"] == before["steps_yielded"] + 1
        assert after["closing_pauses"] == before["closing_pauses"] + 1
    else:
        assert _samples(out) > 0 and after["steps_yielded"] == before["steps_yielded"]
        chunks.append(np.asarray(out))
    _to_end(backend, stream, chunks, Lane.SHORT)
    stream.close()
    assert np.array_equal(np.concatenate(chunks), np.concatenate(whole))


def test_without_a_newcomer_the_short_lanes_closing_calls_all_go_on(model: CosyVoice3, voices: VoiceStore) -> None:
    """Two short-lane streams at their exact closing calls and no request arriving: the first runs whole
    (slice after slice), the second its slice of the step, and the step does not count as ended early."""
    backend = make_backend(model, voices, burst=32)
    backend.stepper.short_closings_yield = True
    streams = [backend.open_stream(t, "default", 1.0) for t in PLAYING]
    for stream in streams:
        _until_closing(backend, stream, [])
    before = backend.step_stats()
    out = backend.step(streams, StepBudget(lanes=(Lane.SHORT, Lane.SHORT)), None, lambda: False)
    after = backend.step_stats()
    assert _samples(out[0]) > 0 and _samples(out[1]) == 0 and streams[1].next_job().finalize
    assert after["steps_yielded"] == before["steps_yielded"]
    assert after["closing_pauses"] == before["closing_pauses"] + 1
    for stream in streams:
        stream.close()
