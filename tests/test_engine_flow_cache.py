"""The flow cache inside the cosyvoice backend and engine: fresh voices, memory in health and metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import generate_latest

from cosyvoice.model import CosyVoice3
from gateway.metrics import GatewayMetrics
from scripts.bench_cosyvoice import synthetic_speaker
from scripts.make_tiny_model import make_model_dir
from tts_engine import TTSEngine
from tts_engine.backends.cosyvoice import CosyVoiceBackend
from tts_engine.voices import VoicePreset, preset_cache_path

TEXT = "今天天气很好。"
# Audio of a cached and an uncached backend: the flow differs by ~1e-6 (tests/test_flow_cache.py), the
# vocoder amplifies that a little; measured max difference here ~1e-6 of full scale.
AUDIO_ATOL = 1e-4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CosyVoice3:
    model_dir = make_model_dir(tmp_path_factory.mktemp("cosy") / "model", "tiny", seed=0, onnx_models=False)
    return CosyVoice3.from_pretrained(model_dir, max_seconds=60)


def add_synthetic_voice(
    backend: CosyVoiceBackend, folder: Path, name: str, seconds: float, seed: int
) -> None:
    """Register a synthetic speaker through the voice cache (no ONNX frontend needed)."""
    wav = folder / f"{name}-{seed}.wav"
    wav.write_bytes(f"synthetic speaker {seed}".encode())
    preset = VoicePreset(name=name, prompt_wav=wav, prompt_text="synthetic")
    torch.manual_seed(seed)
    record = synthetic_speaker(backend.model, seconds)
    g = torch.Generator().manual_seed(seed)
    record.prompt_speech_tokens.copy_(torch.randint(0, 6561, record.prompt_speech_tokens.shape, generator=g))
    record.save(preset_cache_path(preset, folder, key=backend.fingerprint))
    backend.add_voice(preset)


def make_backend(model: CosyVoice3, folder: Path, **options: object) -> CosyVoiceBackend:
    return CosyVoiceBackend(
        model=model, seed=3, max_batch_size=4, max_llm_len=512, voice_cache_dir=folder, fixed_llm_tokens=60,
        **options,  # type: ignore[arg-type]
    )  # fmt: skip


def speak(backend: CosyVoiceBackend, voice: str) -> np.ndarray:
    stream = backend.open_stream(TEXT, voice, 1.0)
    chunks = []
    try:
        while (chunk := stream.next_chunk()) is not None:
            chunks.append(np.asarray(chunk.cpu() if isinstance(chunk, torch.Tensor) else chunk))
    finally:
        stream.close()
    return np.concatenate(chunks)


def test_a_deleted_or_overwritten_voice_never_serves_stale_cache(model: CosyVoice3, tmp_path: Path) -> None:
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    cached = make_backend(model, tmp_path / "on")
    plain = make_backend(model, tmp_path / "off", flow_cache=False)
    assert cached.flow_cache is not None and plain.flow_cache is None
    try:
        add_synthetic_voice(cached, tmp_path / "on", "v", 3.0, seed=1)
        first = speak(cached, "v")
        old_prompt = cached._voices["v"].flow_prompt
        assert cached.flow_cache.has_voice(old_prompt)  # the prompt chunks were kept
        assert cached.flow_cache.stream_bytes == 0  # the finished stream gave its chunks back
        np.testing.assert_allclose(
            speak(cached, "v"), first, atol=AUDIO_ATOL, rtol=0
        )  # served from the cache
        assert cached.flow_cache.counts["voice_hits"] >= 1

        add_synthetic_voice(cached, tmp_path / "on", "v", 3.0, seed=2)  # overwritten: another speaker
        assert not cached.flow_cache.has_voice(old_prompt)
        add_synthetic_voice(plain, tmp_path / "off", "v", 3.0, seed=2)
        fresh = speak(cached, "v")
        np.testing.assert_allclose(fresh, speak(plain, "v"), atol=AUDIO_ATOL, rtol=0)
        assert np.abs(fresh[: len(first)] - first[: len(fresh)]).max() > 1e-2  # really another voice

        cached.remove_voice("v")
        assert cached.flow_cache.used_bytes == 0
    finally:
        cached.close()
        plain.close()


def test_flow_cache_memory_shows_in_health_and_metrics(model: CosyVoice3, tmp_path: Path) -> None:
    backend = make_backend(model, tmp_path, flow_cache_mib=64)
    add_synthetic_voice(backend, tmp_path, "v", 3.0, seed=4)
    engine = TTSEngine(backend)
    metrics = GatewayMetrics()
    metrics.watch_engine(lambda: engine.stats)

    async def main() -> dict:
        await engine.start()
        try:
            async for _ in engine.synthesize(TEXT, voice="v"):
                pass
            return engine.health()
        finally:
            await engine.close()

    health = asyncio.run(main())
    memory = health["memory"]
    assert memory["flow_cache_limit_bytes"] == 64 << 20
    assert memory["flow_cache_voice_bytes"] > 0 and memory["flow_cache_voices"] == 1
    assert memory["flow_cache_bytes"] == memory["flow_cache_voice_bytes"] + memory["flow_cache_stream_bytes"]
    exposition = generate_latest(metrics.registry).decode()
    assert "xz_engine_flow_cache_bytes" in exposition
    assert "xz_engine_flow_cache_voice_hits" in exposition


def test_a_voice_prefix_is_cached_when_the_voice_is_added(model: CosyVoice3, tmp_path: Path) -> None:
    for sub in ("warm", "cold", "off"):
        (tmp_path / sub).mkdir()
    warm = make_backend(model, tmp_path / "warm")
    cold = make_backend(model, tmp_path / "cold", flow_cache_warm=False)
    plain = make_backend(model, tmp_path / "off", flow_cache=False)
    assert warm.flow_cache is not None and cold.flow_cache is not None
    try:
        for backend, sub in ((warm, "warm"), (cold, "cold"), (plain, "off")):
            add_synthetic_voice(backend, tmp_path / sub, "v", 3.0, seed=5)
        prompt = warm._voices["v"].flow_prompt
        assert warm.flow_cache.has_voice(prompt)  # before any request
        stats = warm.flow_cache.stats()
        assert stats["flow_cache_voices"] == 1 and stats["flow_cache_voice_bytes"] > 0
        assert stats["flow_cache_stream_bytes"] == 0  # the filling call's own chunks were given back
        assert not cold.flow_cache.has_voice(cold._voices["v"].flow_prompt)

        first = speak(warm, "v")
        assert warm.flow_cache.counts["voice_hits"] == 1  # the first request started from the prefix
        np.testing.assert_allclose(first, speak(plain, "v"), atol=AUDIO_ATOL, rtol=0)

        warm.remove_voice("v")
        assert warm.flow_cache.used_bytes == 0
    finally:
        for backend in (warm, cold, plain):
            backend.close()


def test_a_warmed_prefix_gives_the_uncached_mel(model: CosyVoice3, tmp_path: Path) -> None:
    from cosyvoice.flow.chunk_cache import FlowCacheManager
    from tts_engine.backends.cosyvoice.flow_warm import warm_voice_prefix

    backend = make_backend(model, tmp_path, flow_cache=False)
    add_synthetic_voice(backend, tmp_path, "v", 3.0, seed=6)
    prompt = backend._voices["v"].flow_prompt
    t2w = model.token2wav
    manager = FlowCacheManager(256 << 20)
    assert warm_voice_prefix(t2w, prompt, manager)
    assert manager.stream_bytes == 0 and manager.voice_bytes > 0
    tokens = torch.randint(0, 6561, (1, 40), generator=torch.Generator().manual_seed(7), dtype=torch.int32)
    args = (
        tokens, [40], prompt.prompt_token.to(torch.int32)[None], [int(prompt.prompt_token.shape[0])],
        prompt.prompt_feat.float()[None], [int(prompt.prompt_feat.shape[0])], prompt.embedding.float()[None],
    )  # fmt: skip
    reference = t2w.flow.inference(*args, streaming=[True], finalize=[False])
    cache = manager.stream_cache(prompt)
    try:
        mel = t2w.flow.inference(*args, streaming=[True], finalize=[False], caches=[cache], skip_frames=[0])
        assert manager.counts["voice_hits"] == 1  # it started from the warmed prefix
    finally:
        cache.release()
    torch.testing.assert_close(mel, reference, atol=1e-5, rtol=0)
    backend.close()
