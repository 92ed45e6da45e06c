"""Exact closing passes keep moving under steady arrivals (tiny CosyVoice model; issue 25): with
``BatchedStep.closing_progress`` a step that a new request ended before any short or comfortable
closing pass advanced still runs one slice of the first of them, after its urgent audio.

Stepped by hand with the lanes the scheduler would give; counted in slices and samples, not seconds.
"""

from __future__ import annotations

import numpy as np
import pytest

from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from tests.test_first_audio_bursts import (
    PLAYING,
    _samples,
    _to_end,
    _until_closing,
    make_backend,
    model,
    voices,
)
from tts_engine.budget import Lane, StepBudget

__all__ = ["model", "voices"]  # the fixtures


@pytest.mark.parametrize("progress", [True, False])
def test_a_comfortable_closing_pass_advances_a_slice_a_step_though_every_step_yields(
    model: CosyVoice3, voices: VoiceStore, progress: bool
) -> None:
    """Every step ends early for a newcomer. With ``closing_progress`` the comfortable closing pass runs a
    slice a step all the same and ends with the same audio, bit for bit, as run whole; without it, it
    never starts."""
    backend = make_backend(model, voices, burst=32)
    assert backend.stepper.closing_progress  # on by default
    whole: list[np.ndarray] = []
    reference = backend.open_stream(PLAYING[1], "default", 1.0)
    _until_closing(backend, reference, whole)
    _to_end(backend, reference, whole, Lane.URGENT)  # the closing call whole, in the urgent group
    reference.close()

    backend.stepper.closing_progress = progress
    chunks: list[np.ndarray] = []
    stream = backend.open_stream(PLAYING[1], "default", 1.0)  # the same text and seed: the same tokens
    _until_closing(backend, stream, chunks)
    before = backend.step_stats()
    comfortable = StepBudget(lanes=(Lane.COMFORTABLE,))
    for _ in range(40):
        [out] = backend.step([stream], comfortable, None, lambda: True)
        if _samples(out):
            chunks.append(np.asarray(out))
            break
    after = backend.step_stats()
    steps = after["steps_yielded"] - before["steps_yielded"]
    if progress:
        assert chunks[-1] is not None and 2 <= steps < 40  # a slice a step, then its audio
        assert after["closing_progress_slices"] - before["closing_progress_slices"] == steps
        assert after["closing_pauses"] - before["closing_pauses"] == steps - 1
        _to_end(backend, stream, chunks, Lane.COMFORTABLE)
        assert np.array_equal(np.concatenate(chunks), np.concatenate(whole))
    else:
        assert steps == 40 and after["closing_pauses"] == before["closing_pauses"]
        assert after["closing_progress_slices"] == before["closing_progress_slices"]
        assert id(stream) not in backend.stepper.under_way and stream.next_job().finalize
    stream.close()


def test_no_extra_slice_where_the_lanes_closing_passes_advanced_and_the_first_in_rank_goes_first(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    """With no newcomer the comfortable lane slices its own closing pass: no extra slice. Ended early, the
    step slices the first closing pass in rank order (here the short lane's), only that one."""
    backend = make_backend(model, voices, burst=32)
    backend.stepper.closing_progress = True
    streams = [backend.open_stream(t, "default", 1.0) for t in PLAYING]
    for stream in streams:
        _until_closing(backend, stream, [])
    before = backend.step_stats()
    backend.step([streams[1]], StepBudget(lanes=(Lane.COMFORTABLE,)), None, lambda: False)
    after = backend.step_stats()
    assert after["closing_progress_slices"] == before["closing_progress_slices"]
    assert after["closing_pauses"] == before["closing_pauses"] + 1 and id(streams[1]) in backend.stepper.under_way
    backend.step(streams, StepBudget(lanes=(Lane.SHORT, Lane.COMFORTABLE)), None, lambda: True)
    last = backend.step_stats()
    assert last["closing_progress_slices"] == after["closing_progress_slices"] + 1
    assert last["closing_pauses"] == after["closing_pauses"] + 1 and id(streams[0]) in backend.stepper.under_way
    for stream in streams:
        stream.close()


def test_a_closing_pass_run_whole_in_its_lanes_batch_takes_no_extra_slice(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    """A step asked nothing about newcomers (``should_yield`` None) runs the short lane's closing pass whole,
    in its batch: that pass is done, so no slice follows (a slice of it would be a stale job: its
    stream failed, in the first A/B of the setting)."""
    backend = make_backend(model, voices, burst=32)
    backend.stepper.closing_progress = True
    stream = backend.open_stream(PLAYING[0], "default", 1.0)
    _until_closing(backend, stream, [])
    before = backend.step_stats()
    [out] = backend.step([stream], StepBudget(lanes=(Lane.SHORT,)))
    assert _samples(out) > 0 and stream.next_job() is None  # its last audio
    assert backend.step_stats()["closing_progress_slices"] == before["closing_progress_slices"]
    stream.close()
