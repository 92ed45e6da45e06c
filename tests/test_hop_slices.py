"""Hops in slices (tiny CosyVoice model; issue 25): with ``BatchedStep.hop_slices`` (off by default) the
comfortable lane's hops run a few Euler steps a slice, a request arriving meanwhile ends them between two
slices, and ``closing_progress`` moves them a slice in steps a request ended early; the audio stays the
same bit for bit.

Stepped by hand with the lanes the scheduler would give; counted in slices and samples, not seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from tests.test_first_audio_bursts import PLAYING, _samples, make_backend, model, playing_and_newcomer, voices
from tts_engine.backends.cosyvoice import CosyVoiceBackend
from tts_engine.backends.cosyvoice.wave_step import CLOSING_SLICE
from tts_engine.budget import Lane, StepBudget

__all__ = ["model", "voices"]  # the fixtures


def _hops_under_way(backend: CosyVoiceBackend) -> int:
    return sum(not pending.job.finalize for _, pending in backend.stepper.under_way.values())


def _play(
    backend: CosyVoiceBackend, text: str, interrupt: bool, later: Lane = Lane.COMFORTABLE
) -> tuple[np.ndarray, int]:
    """A whole sentence, urgent until its opening and in the ``later`` lane after; with ``interrupt`` a
    request arrives in every step as soon as a hop slice ran. Its audio, and the steps that ended mid-hop."""
    stream = backend.open_stream(text, "default", 1.0)
    chunks: list[np.ndarray] = []
    paused = 0
    for _ in range(2000):
        lane = Lane.URGENT if stream.awaits_opening else later
        start = backend.stepper.num_hop_slices

        def arrived(start: int = start) -> bool:
            return backend.stepper.num_hop_slices > start

        [out] = backend.step([stream], StepBudget(lanes=(lane,)), None, arrived if interrupt else None)
        assert not isinstance(out, BaseException), out
        if out is None:
            break
        chunks.append(np.asarray(out))
        paused += _hops_under_way(backend)
    else:
        raise AssertionError("the stream did not end")
    stream.close()
    return np.concatenate(chunks), paused


@pytest.mark.parametrize("vocoder_pieces", [True, False])
def test_a_request_arriving_mid_hop_ends_it_between_two_slices_with_the_same_audio(
    model: CosyVoice3, voices: VoiceStore, vocoder_pieces: bool
) -> None:
    """With ``vocoder_pieces`` (on on a CPU) the request ends it between its last slice and its vocoder
    too: one pause more a hop."""
    backend = make_backend(model, voices, burst=32)
    assert not backend.stepper.hop_slices  # off by default
    assert backend.stepper.vocoder_pieces  # a CPU
    backend.stepper.vocoder_pieces = vocoder_pieces
    whole, paused = _play(backend, PLAYING[1], interrupt=True)  # whole hops: nothing to end mid-way
    assert paused == 0
    backend.stepper.hop_slices = True
    before = backend.step_stats()
    sliced, paused = _play(backend, PLAYING[1], interrupt=True)  # the same text and seed: the same tokens
    after = backend.step_stats()
    slices = math.ceil(model.token2wav.flow.cfg.n_timesteps / CLOSING_SLICE)
    pauses = slices - 1 + vocoder_pieces  # each hop a slice a step: paused after all but its last (and its vocoder)
    assert paused > 0 and paused % pauses == 0
    assert after["hop_slices"] - before["hop_slices"] >= paused - vocoder_pieces * paused // pauses
    assert after["vocoder_pauses"] - before["vocoder_pauses"] == vocoder_pieces * paused // pauses
    assert np.array_equal(sliced, whole)  # bit for bit


@pytest.mark.parametrize("vocoder_pieces", [True, False])
def test_with_short_hop_slices_a_request_ends_a_short_lane_hop_between_two_slices_with_the_same_audio(
    model: CosyVoice3, voices: VoiceStore, vocoder_pieces: bool
) -> None:
    """``short_hop_slices`` (on by default): the short lane's hops run so too on a CPU, where a request
    already ends the short lane's closing pass between two slices (``short_closings_yield``)."""
    backend = make_backend(model, voices, burst=32)
    backend.stepper.vocoder_pieces = vocoder_pieces
    assert backend.stepper.short_hop_slices and backend.stepper.short_closings_yield  # a CPU
    backend.stepper.short_hop_slices = False
    whole, paused = _play(backend, PLAYING[1], interrupt=True, later=Lane.SHORT)
    assert paused == 0  # short hops whole, and hop_slices (the comfortable lane's) changes nothing here
    backend.stepper.hop_slices = True
    assert _play(backend, PLAYING[1], interrupt=True, later=Lane.SHORT)[1] == 0
    backend.stepper.hop_slices = False
    backend.stepper.short_hop_slices = True
    before = backend.step_stats()
    sliced, paused = _play(backend, PLAYING[1], interrupt=True, later=Lane.SHORT)
    after = backend.step_stats()
    slices = math.ceil(model.token2wav.flow.cfg.n_timesteps / CLOSING_SLICE)
    pauses = slices - 1 + vocoder_pieces  # each hop a slice a step: paused after all but its last (and its vocoder)
    assert paused > 0 and paused % pauses == 0
    assert after["hop_slices"] - before["hop_slices"] >= paused - vocoder_pieces * paused // pauses
    assert np.array_equal(sliced, whole)  # bit for bit
    backend.stepper.short_closings_yield = False  # as on a GPU: the short lane's hops batched, whole
    before = backend.step_stats()
    assert _play(backend, PLAYING[1], interrupt=True, later=Lane.SHORT)[1] == 0
    assert backend.step_stats()["hop_slices"] == before["hop_slices"]  # not a call a row


@pytest.mark.parametrize(("lane", "hop_slices"), [(Lane.SHORT, True), (Lane.SHORT, False), (Lane.COMFORTABLE, True)])
def test_a_ready_short_hop_advances_a_slice_a_step_though_every_step_yields(
    model: CosyVoice3, voices: VoiceStore, lane: Lane, hop_slices: bool
) -> None:
    """Every step ends early for a newcomer. With ``hop_slices`` ``closing_progress`` runs a slice of the
    short lane's hop in each, its audio with the last; without, or in the comfortable lane (a slice there
    would only delay the newcomer: that listener has time), the hop waits for a step nobody ends."""
    backend = make_backend(model, voices, burst=32)
    backend.stepper.hop_slices = hop_slices
    playing, newcomer = playing_and_newcomer(backend)
    newcomer.close()
    job = playing.next_job()
    assert job is not None and not job.finalize  # a hop, its tokens there
    slices = math.ceil(model.token2wav.flow.cfg.n_timesteps / CLOSING_SLICE)
    before = backend.step_stats()
    budget = StepBudget(lanes=(lane,))
    sizes = [_samples(backend.step([playing], budget, None, lambda: True)[0]) for _ in range(slices + 1)]
    after = backend.step_stats()
    if hop_slices and lane == Lane.SHORT:
        assert sizes[: slices - 1] == [0] * (slices - 1) and sizes[slices - 1] > 0  # its audio with the last slice
        assert after["closing_progress_slices"] - before["closing_progress_slices"] >= slices
        assert after["hop_slices"] - before["hop_slices"] >= slices
    else:
        assert sizes == [0] * (slices + 1) and after["hop_slices"] == before["hop_slices"]
    playing.close()
