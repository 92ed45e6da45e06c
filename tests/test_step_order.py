"""The step order (tts_engine/backends/cosyvoice/step.py) moves a hop in time, never changes what it computes.

Several staggered streams on the tiny model, stepped by hand with the lanes the scheduler would give
them (a newcomer waiting for first audio is urgent, everyone else holds their later hops and closing
passes): every stream's audio in the ``slack`` order (urgent group first, its audio handed out mid-step,
held hops in later steps, exact closing calls a few Euler steps at a time) equals, bit for bit, its
audio in the ``together`` order of before. Once without decode bursts (so a newcomer waits for its
opening tokens over many steps, and the holding is exercised), once with them, a stream in the short
lane and steps that end early (``should_yield``). One flow + vocoder row per call
(``max_hop_rows=1``), since a batched call's float rounding depends on which rows share it (today as
well: a stream's samples move by ~1e-6 with its batch companions), which is not the order's doing.
"""

from __future__ import annotations

import numpy as np
import pytest

from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from scripts.make_tiny_model import make_model_dir
from tests.test_backend_cosyvoice import prompt_wav
from tts_engine.backends.cosyvoice import CosyVoiceBackend
from tts_engine.budget import Lane, StepBudget

TEXTS = ("你好，今天天气很好。", "Hello there, how are you?", "我们一起去公园散步吧。", "Good morning.")
ARRIVAL_STEPS = (0, 30, 60, 90)  # staggered: each arrives while the others are mid-reply or closing


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CosyVoice3:
    model_dir = make_model_dir(tmp_path_factory.mktemp("cosyvoice") / "model", "tiny", seed=0)
    return CosyVoice3.from_pretrained(model_dir, max_seconds=60)


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> VoiceStore:
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    store.add("default", prompt_wav(2.0), "希望你以后能够做的比我还好呦。")
    return store


def run_staggered(
    model: CosyVoice3, voices: VoiceStore, order: str, *, burst: int = 0, short_and_yield: bool = False
) -> tuple[list[np.ndarray], dict, int]:
    """Every stream's audio, the backend's step counters, and the chunks handed out mid-step. With
    ``short_and_yield`` the second stream is in the short lane once it plays, and every other step is
    asked to end after its urgent audio."""
    backend = CosyVoiceBackend(
        model=model, seed=5, max_batch_size=4, max_llm_len=512, voice_cache_dir=voices.cache_dir,
        fixed_llm_tokens=90, max_hop_rows=1, step_order=order,
    )  # fmt: skip
    backend.stepper.decode_burst = burst
    for preset in voices.presets():
        backend.add_voice(preset)
    streams: list = []
    audio: list[list[np.ndarray]] = [[] for _ in TEXTS]
    live: list[int] = []
    early = 0
    for step in range(3000):
        for i, at in enumerate(ARRIVAL_STEPS):
            if at == step:
                streams.append(backend.open_stream(TEXTS[i], "default", 1.0))
                live.append(i)
        if not live and step > ARRIVAL_STEPS[-1]:
            break
        waiting = any(not audio[i] for i in live)
        lanes = tuple(
            Lane.URGENT if not audio[i]
            else Lane.SHORT if short_and_yield and i == 1
            else Lane.DEFERRED if waiting else Lane.COMFORTABLE
            for i in live
        )  # fmt: skip
        got: dict[int, np.ndarray] = {}
        order_now = tuple(live)
        outputs = backend.step(
            [streams[i] for i in live],
            StepBudget(hop_rows=1, lanes=lanes),
            lambda items: got.update({order_now[index]: chunk.numpy() for index, chunk in items}),  # noqa: B023
            (lambda: True) if short_and_yield and step % 2 else None,
        )
        early += len(got)
        for i, out in zip(list(live), outputs, strict=True):
            assert not isinstance(out, BaseException), out
            if i in got:
                audio[i].append(got[i])
            if out is None:
                streams[i].close()
                live.remove(i)
            elif out.size:
                audio[i].append(np.asarray(out))
    assert not live, "streams did not finish"
    stats = backend.step_stats()
    backend.close()
    return [np.concatenate(chunks) for chunks in audio], stats, early


def test_the_slack_order_holds_and_hands_out_early_and_every_stream_sounds_the_same(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    before, before_stats, before_early = run_staggered(model, voices, "together")
    after, after_stats, after_early = run_staggered(model, voices, "slack")
    assert before_stats["hops_held"] == before_stats["closing_pauses"] == before_early == 0  # nothing moves
    # the new order really held hops, sliced closing calls and handed audio out mid-step
    assert after_stats["hops_held"] > 0 and after_stats["closing_pauses"] > 0 and after_early > 0
    for old, new in zip(before, after, strict=True):
        assert old.size > 24000 and np.array_equal(old, new)
    bursts, burst_stats, burst_early = run_staggered(model, voices, "slack", burst=32, short_and_yield=True)
    # a newcomer's opening tokens came in bursts, short-lane work waited for steps that ended early
    assert burst_stats["decode_bursts"] > 0 and burst_stats["steps_yielded"] > 0 and burst_early > 0
    for old, new in zip(before, bursts, strict=True):
        assert np.array_equal(old, new)
