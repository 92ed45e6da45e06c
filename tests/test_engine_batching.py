"""The engine batching CosyVoice streams (tiny random model): equality, abort, memory cap, isolation."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cosyvoice.llm import LengthRule
from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from scripts.make_tiny_model import make_model_dir
from tests.test_backend_cosyvoice import prompt_wav
from tts_engine import EngineOverloaded, SynthesisFailed, TTSEngine
from tts_engine.backends.cosyvoice import CosyVoiceBackend, kv_cache_bytes
from tts_engine.memory import MemoryBudget, estimate_activation_bytes_per_row, module_bytes

SEED = 11
MAX_LLM_LEN = 256
TEXTS = ("你好。", "是的。", "我们走吧。")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CosyVoice3:
    model_dir = make_model_dir(tmp_path_factory.mktemp("cosyvoice") / "model", "tiny", seed=0)
    model = CosyVoice3.from_pretrained(model_dir, max_seconds=60)
    model.lengths = LengthRule(min_token_text_ratio=2, max_token_text_ratio=8)  # short utterances
    return model


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> VoiceStore:
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    store.add("default", prompt_wav(), "希望你以后能够做的比我还好呦。")
    return store


def make_backend(model: CosyVoice3, voices: VoiceStore, **options: object) -> CosyVoiceBackend:
    options = {"seed": SEED, "max_batch_size": 4, "max_llm_len": MAX_LLM_LEN, **options}
    backend = CosyVoiceBackend(model=model, voice_cache_dir=voices.cache_dir, **options)  # type: ignore[arg-type]
    for preset in voices.presets():
        backend.add_voice(preset)
    return backend


def budget_for_slots(model: CosyVoice3, slots: float) -> MemoryBudget:
    weights = module_bytes(model.llm, model.token2wav.flow, model.token2wav.hift)
    per_row = kv_cache_bytes(model, max_batch=1, max_len=MAX_LLM_LEN) + estimate_activation_bytes_per_row(
        model
    )
    return MemoryBudget(int(weights + slots * per_row))


async def read_all(stream) -> np.ndarray:
    async with asyncio.timeout(60):
        chunks = [chunk async for chunk in stream]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


async def wait_until(predicate, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def solo_audio(model: CosyVoice3, voices: VoiceStore) -> dict[str, np.ndarray]:
    """Each text alone, one request at a time (max_batch_size=1), at 16 kHz."""

    async def run() -> dict[str, np.ndarray]:
        engine = TTSEngine(make_backend(model, voices, max_batch_size=1))
        await engine.start()
        try:
            return {
                t: await read_all(engine.synthesize(t, voice="default", output_rate=16000)) for t in TEXTS
            }
        finally:
            await engine.close()

    return asyncio.run(run())


def assert_same_audio(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.size == expected.size > 0
    assert np.abs(got.astype(np.int32) - expected.astype(np.int32)).max() <= 8  # float rounding, int16 LSBs


async def test_batched_requests_equal_solo_runs(
    model: CosyVoice3, voices: VoiceStore, solo_audio: dict[str, np.ndarray]
) -> None:
    engine = TTSEngine(make_backend(model, voices))
    await engine.start()
    try:
        streams = [engine.synthesize(t, voice="default", output_rate=16000) for t in TEXTS]
        results = await asyncio.gather(*(read_all(s) for s in streams))
        assert engine.stats["max_batch_size_seen"] >= 2  # they really shared steps
    finally:
        await engine.close()
    for text, got in zip(TEXTS, results, strict=True):
        assert_same_audio(got, solo_audio[text])


async def test_abort_mid_stream_frees_the_slot_at_once(model: CosyVoice3, voices: VoiceStore) -> None:
    backend = make_backend(model, voices, max_batch_size=2)
    engine = TTSEngine(backend)
    await engine.start()
    try:
        doomed = engine.synthesize(TEXTS[2], voice="default", output_rate=24000)
        other = engine.synthesize(TEXTS[0], voice="default", output_rate=24000)
        async with asyncio.timeout(30):
            await anext(doomed)
        await doomed.aclose()
        # The abort frees the KV slot before it is counted, so both are visible together.
        await wait_until(lambda: engine.stats["requests_aborted"] == 1)
        assert backend.num_open_streams <= 1 and engine.stats["running"] <= 1
        assert (await read_all(other)).size > 0
        await wait_until(lambda: backend.runner.num_free_slots == 2 and engine.stats["live"] == 0)
    finally:
        await engine.close()


async def test_memory_cap_queues_requests_beyond_the_kv_slots(
    model: CosyVoice3, voices: VoiceStore, solo_audio: dict[str, np.ndarray]
) -> None:
    backend = make_backend(model, voices, max_batch_size=8, memory_budget=budget_for_slots(model, 2.5))
    assert backend.capacity() == 2 and backend.runner.cache.max_batch == 2
    engine = TTSEngine(backend, max_buffered_chunks=1)
    scheduler = engine._engine.scheduler
    seen: list[tuple[int, int, int]] = []  # after each plan: (holding a slot, running, waiting)
    schedule = scheduler.schedule

    def schedule_and_note():
        plan = schedule()
        seen.append((scheduler.num_holding(), len(scheduler.running), len(scheduler.waiting)))
        return plan

    scheduler.schedule = schedule_and_note  # type: ignore[method-assign]
    await engine.start()
    try:
        texts = [TEXTS[0], TEXTS[1], TEXTS[0], TEXTS[1]]
        streams = [engine.synthesize(t, voice="default", output_rate=16000) for t in texts]
        health = engine.health()
        assert health["memory"]["kv_slots"] == 2 and health["memory"]["memory_budget_bytes"] > 0
        results = await asyncio.gather(*(read_all(s) for s in streams))
        assert engine.stats["max_batch_size_seen"] <= 2
    finally:
        await engine.close()
    # the first two took both slots while two waited; a stream whose LLM has finished gives its slot to
    # a waiting one (its remaining hops need none), and no more than two ever held one
    assert seen[0] == (2, 2, 2) and max(holding for holding, _, _ in seen) <= 2
    for text, got in zip(texts, results, strict=True):
        assert_same_audio(got, solo_audio[text])


async def test_a_request_waiting_past_the_bound_fails_with_engine_overloaded(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    # the holder's LLM runs long: parked at the buffer bound, it keeps its slot (a finished LLM gives it back)
    backend = make_backend(model, voices, max_batch_size=1, fixed_llm_tokens=200)
    engine = TTSEngine(backend, max_buffered_chunks=1, max_queue_wait_s=0.3)
    await engine.start()
    try:
        holder = engine.synthesize(TEXTS[0], voice="default", output_rate=16000)
        await wait_until(lambda: engine.stats["running"] == 1 and engine.stats["runnable"] == 0)
        late = engine.synthesize(TEXTS[1], voice="default", output_rate=16000)
        with pytest.raises(EngineOverloaded, match=r"waited 0.3 s for capacity"):
            await read_all(late)
        assert engine.stats["requests_timed_out"] == 1
        assert (await read_all(holder)).size > 0  # the holder is unaffected
    finally:
        await engine.close()


async def test_a_failing_request_does_not_disturb_its_batch_neighbours(
    model: CosyVoice3, voices: VoiceStore, solo_audio: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = make_backend(model, voices)
    open_stream = backend.open_stream

    def open_with_a_bomb(text, voice, speed, instruct=None):  # "是的。" fails at its 5th speech token
        stream = open_stream(text, voice, speed, instruct)
        if text == TEXTS[1]:
            wave = stream.segments[0].wave
            add_tokens = wave.add_tokens
            calls = []

            def add_or_fail(tokens):
                calls.append(tokens)
                if len(calls) == 5:
                    raise RuntimeError("injected failure")
                add_tokens(tokens)

            monkeypatch.setattr(wave, "add_tokens", add_or_fail)
        return stream

    monkeypatch.setattr(backend, "open_stream", open_with_a_bomb)
    engine = TTSEngine(backend)
    await engine.start()
    try:
        streams = [engine.synthesize(t, voice="default", output_rate=16000) for t in TEXTS]
        results = await asyncio.gather(*(read_all(s) for s in streams), return_exceptions=True)
        assert engine.stats["requests_failed"] == 1 and engine.stats["requests_finished"] == 2
        assert backend.runner.num_free_slots == 4
    finally:
        await engine.close()
    assert isinstance(results[1], SynthesisFailed) and "injected" in str(results[1])
    assert_same_audio(results[0], solo_audio[TEXTS[0]])
    assert_same_audio(results[2], solo_audio[TEXTS[2]])
