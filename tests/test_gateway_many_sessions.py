"""16 device sessions at once through the gateway, one shared CosyVoice engine (tiny random model).

Every session asks at the same time; the engine batches their sentences. Each must get its whole
sentence: at least the samples the same sentence gives alone through the engine (the device's Opus
frames pad the tail to whole 60 ms frames).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from cosyvoice.llm import LengthRule
from cosyvoice.model import CosyVoice3
from gateway.llm.echo import EchoLLM
from scripts.device_sim import DeviceSimulator
from scripts.make_tiny_model import make_model_dir
from tests.gateway_server import running_gateway
from tests.test_backend_cosyvoice import prompt_wav
from tts_engine import TTSEngine
from tts_engine.backends.cosyvoice import CosyVoiceBackend

NUM_SESSIONS = 16
SEED = 5
RATE = 24000
TEXTS = ("好。", "是的。")
FRAME = RATE * 60 // 1000


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CosyVoice3:
    model_dir = make_model_dir(tmp_path_factory.mktemp("cosyvoice") / "model", "tiny", seed=0)
    model = CosyVoice3.from_pretrained(model_dir, max_seconds=60)
    model.lengths = LengthRule(min_token_text_ratio=2, max_token_text_ratio=8)
    return model


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("voices")
    (path / "default.wav").write_bytes(prompt_wav())
    (path / "default.yaml").write_text("prompt_wav: default.wav\nprompt_text: 你好。\n", encoding="utf-8")
    return path


def make_backend(model: CosyVoice3, voices_dir: Path) -> CosyVoiceBackend:
    return CosyVoiceBackend(
        model=model,
        seed=SEED,
        max_batch_size=NUM_SESSIONS,
        max_llm_len=256,
        voice_cache_dir=voices_dir / ".cache",
    )


async def solo_samples(model: CosyVoice3, voices_dir: Path) -> dict[str, int]:
    """Samples of each sentence alone through an engine (same seed: the same speech tokens)."""
    from gateway.voices.store import VoiceStore

    backend = make_backend(model, voices_dir)
    for preset in VoiceStore(voices_dir).load():
        backend.add_voice(preset)
    engine = TTSEngine(backend)
    await engine.start()
    try:
        sizes = {}
        for text in TEXTS:
            chunks = [c async for c in engine.synthesize(text, voice="default", output_rate=RATE)]
            sizes[text] = sum(c.size for c in chunks)
        return sizes
    finally:
        await engine.close()


async def one_session(url: str, index: int) -> tuple[str, object]:
    text = TEXTS[index % len(TEXTS)]
    sim = DeviceSimulator(url, device_id=f"aa:bb:cc:00:00:{index:02x}", protocol_version=1)
    await sim.connect()
    try:
        await sim.listen_start("auto")
        return text, await sim.ask(text, timeout=90)
    finally:
        await sim.close()


async def test_sixteen_concurrent_sessions_all_receive_complete_audio(
    model: CosyVoice3, voices_dir: Path
) -> None:
    expected = await solo_samples(model, voices_dir)
    overrides = {"tts": {"voices_dir": str(voices_dir)}, "audio": {"output_sample_rate": RATE}}
    backend = make_backend(model, voices_dir)
    async with running_gateway(overrides, backend=backend, llm=EchoLLM(chinese_prefix="", prefix="")) as gw:
        async with asyncio.timeout(120):
            results = await asyncio.gather(*(one_session(gw.url, i) for i in range(NUM_SESSIONS)))
        stats = gw.services.engine.stats
    assert stats["requests_finished"] >= NUM_SESSIONS and stats["requests_failed"] == 0
    assert stats["max_batch_size_seen"] >= 4  # the sessions' sentences shared engine steps
    for text, turn in results:
        assert turn.sentences == [text]
        got = turn.audio.size
        assert expected[text] <= got <= expected[text] + 2 * FRAME, (text, got, expected[text])
        assert np.abs(turn.audio.astype(np.int32)).max() > 100
