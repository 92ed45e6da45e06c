"""Priority classes end to end (tiny CosyVoice model): a flood of batch work does not delay a device's
first chunk by more than one engine step, and the batch work still completes, parked and resumed intact.

Steps are counted, not seconds: ``EngineRequest.arrival_step`` and ``first_chunk_step`` are the engine's
step clock when the request arrived and when its first chunk was handed out.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from scripts.make_tiny_model import make_model_dir
from tests.test_backend_cosyvoice import prompt_wav
from tts_engine import TTSEngine
from tts_engine.backends.cosyvoice import CosyVoiceBackend
from tts_engine.request import EngineRequest

SLOTS = 3
BATCH_TEXTS = ("第一句话。", "Second one.", "第三句。", "Fourth line.", "第五。", "Sixth.", "第七句话。")
DEVICE_TEXT = "你好，我在这里。"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CosyVoice3:
    model_dir = make_model_dir(tmp_path_factory.mktemp("cosyvoice") / "model", "tiny", seed=0)
    return CosyVoice3.from_pretrained(model_dir, max_seconds=60)


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> VoiceStore:
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    store.add("default", prompt_wav(2.0), "希望你以后能够做的比我还好呦。")
    return store


async def started_engine(model: CosyVoice3, voices: VoiceStore, slots: int) -> tuple[TTSEngine, list]:
    backend = CosyVoiceBackend(
        model=model, seed=3, max_batch_size=slots, max_llm_len=512, voice_cache_dir=voices.cache_dir,
        fixed_llm_tokens=70,
    )  # fmt: skip
    for preset in voices.presets():
        backend.add_voice(preset)
    engine = TTSEngine(backend, max_buffered_chunks=2, max_queue_wait_s=None)
    scheduler = engine._engine.scheduler
    seen: list[EngineRequest] = []
    add = scheduler.add_request
    scheduler.add_request = lambda r: (seen.append(r), add(r))[-1]  # type: ignore[method-assign]
    await engine.start()
    return engine, seen


async def read_all(stream) -> np.ndarray:
    async with asyncio.timeout(120):
        return np.concatenate([chunk async for chunk in stream])


def steps_to_first_chunk(request: EngineRequest) -> int:
    assert request.first_chunk_step is not None
    return request.first_chunk_step - request.arrival_step


async def test_a_flood_of_batch_work_yields_to_a_device_turn_and_still_completes(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    engine, seen = await started_engine(model, voices, SLOTS)
    try:  # the reference: the device turn on an idle engine, then each batch text alone
        lone = await read_all(engine.synthesize(DEVICE_TEXT, output_rate=16000, priority="device"))
        lone_steps = steps_to_first_chunk(seen[-1])
        solo = [await read_all(engine.synthesize(t, output_rate=16000, priority="batch")) for t in BATCH_TEXTS]
    finally:
        await engine.close()

    engine, seen = await started_engine(model, voices, SLOTS)
    try:
        flood = [engine.synthesize(t, output_rate=16000, priority="batch") for t in BATCH_TEXTS]
        readers = [asyncio.create_task(read_all(s)) for s in flood]
        # every slot busy with batch work that is producing audio, the rest of the flood queued
        async with asyncio.timeout(60):
            while engine.stats["chunks_total"] < SLOTS or engine.stats["running"] < SLOTS:
                await asyncio.sleep(0.005)
        assert engine.stats["waiting_batch"] == len(BATCH_TEXTS) - SLOTS
        device = await read_all(engine.synthesize(DEVICE_TEXT, output_rate=16000, priority="device"))
        device_request = next(r for r in seen if r.priority == "device")
        results = await asyncio.gather(*readers)
        stats = engine.stats
    finally:
        await engine.close()
    assert steps_to_first_chunk(device_request) <= lone_steps + 1  # at most the step already under way
    assert stats["batch_parks_total"] >= 1  # it had to take a batch stream's slot
    assert np.abs(device.astype(np.int32) - lone.astype(np.int32)).max() <= 8  # float rounding, int16 LSBs
    for got, want in zip(results, solo, strict=True):  # parked and resumed with their state intact
        assert got.size == want.size > 0
        assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 8


def test_a_synth_frame_without_a_priority_is_interactive_and_a_bad_one_is_refused() -> None:
    from tts_engine.arguments import check_priority
    from tts_engine.worker.frames import Synth, decode

    old_client = decode({"t": "synth", "id": "r", "text": "hi", "rate": 16000})  # a gateway of before
    assert isinstance(old_client, Synth) and old_client.priority == "interactive"
    batch = decode({"t": "synth", "id": "r", "text": "hi", "rate": 16000, "priority": "batch"})
    assert isinstance(batch, Synth) and check_priority(batch.priority) == "batch"
    with pytest.raises(ValueError, match="priority must be one of"):
        check_priority(decode({"t": "synth", "id": "r", "text": "hi", "rate": 16000, "priority": "vip"}).priority)
