"""CosyVoiceBackend on a tiny random-weight model: streaming, batching, abort, isolation, modes, gateway."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest

from audio_codecs.wav import wav_bytes
from cosyvoice.llm import LengthRule
from cosyvoice.llm.graph_decode import GraphDecodeRunner
from cosyvoice.model import CosyVoice3
from gateway.llm.echo import EchoLLM
from gateway.voices.store import VoiceStore
from gateway.xiaozhi import AudioOut, TtsStop
from scripts.device_sim import DeviceSimulator
from scripts.make_tiny_model import make_model_dir
from tests.gateway_server import running_gateway
from tts_engine import SynthesisFailed, TTSEngine
from tts_engine.backends.cosyvoice import CosyVoiceBackend, kv_cache_bytes
from tts_engine.backends.cosyvoice.request import CosyVoiceStream
from tts_engine.budget import StepBudget
from tts_engine.voices import VoiceError

SAMPLES_PER_TOKEN = 960  # 2 mel frames of 480 samples at 24 kHz
SEED = 7
MAX_BATCH = 4


def prompt_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A voiced, amplitude-modulated tone: something for the frontend to chew on."""
    t = np.arange(int(seconds * rate)) / rate
    wave = (
        0.3
        * np.sin(2 * np.pi * 180 * t + 3 * np.sin(2 * np.pi * 2 * t))
        * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    )
    return wav_bytes((wave * 32767).astype(np.int16), rate)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CosyVoice3:
    model_dir = make_model_dir(tmp_path_factory.mktemp("cosyvoice") / "model", "tiny", seed=0)
    model = CosyVoice3.from_pretrained(model_dir, max_seconds=60)
    # The tiny model always generates max_len tokens; 12 (not 20) per text token keeps the tests quick.
    model.lengths = LengthRule(min_token_text_ratio=2, max_token_text_ratio=12)
    return model


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> VoiceStore:
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    store.add("default", prompt_wav(), "希望你以后能够做的比我还好呦。")
    store.add("styled", prompt_wav(1.5, 22050), "今天天气很好。", instruct="用四川话说")
    return store


def make_backend(model: CosyVoice3, voices: VoiceStore, **options: object) -> CosyVoiceBackend:
    options = {"seed": SEED, "max_batch_size": MAX_BATCH, "max_llm_len": 512, **options}
    backend = CosyVoiceBackend(model=model, voice_cache_dir=voices.cache_dir, **options)  # type: ignore[arg-type]
    for preset in voices.presets():
        backend.add_voice(preset)
    return backend


@pytest.fixture
def backend(model: CosyVoice3, voices: VoiceStore) -> Iterator[CosyVoiceBackend]:
    backend = make_backend(model, voices)
    yield backend
    backend.close()


def run(backend: CosyVoiceBackend, streams: list[CosyVoiceStream]) -> list[list[np.ndarray] | BaseException]:
    """Step all streams together as the engine does (closing each once it ends); chunks or the error."""
    results: list[list[np.ndarray] | BaseException] = [[] for _ in streams]
    live = list(range(len(streams)))
    for _ in range(2000):
        if not live:
            return results
        outputs = backend.step([streams[i] for i in live])
        for i, out in zip(list(live), outputs, strict=True):
            if isinstance(out, BaseException) or out is None:
                streams[i].close()
                live.remove(i)
                if out is not None:
                    results[i] = out
            elif out.size:
                results[i].append(out)  # type: ignore[union-attr]
    raise AssertionError("streams did not finish")


def audio(chunks: list[np.ndarray] | BaseException) -> np.ndarray:
    assert not isinstance(chunks, BaseException), chunks
    return np.concatenate(chunks)


def flow_tokens(stream: CosyVoiceStream) -> list[list[int]]:
    return [list(segment.llm.flow_tokens) for segment in stream.segments]


async def read_all(stream) -> np.ndarray:
    async with asyncio.timeout(60):
        chunks = [chunk async for chunk in stream]
    return np.concatenate(chunks)


@pytest.fixture
async def engine(backend: CosyVoiceBackend) -> AsyncIterator[TTSEngine]:
    engine = TTSEngine(backend, max_buffered_chunks=1)
    await engine.start()
    yield engine
    await engine.close()


async def test_engine_streams_24khz_pcm_for_a_preset_voice(
    engine: TTSEngine, model: CosyVoice3, voices: VoiceStore
) -> None:
    assert engine.sample_rate == 24000 and engine.voices == ["default", "styled"]
    assert engine.default_voice == "default" and engine.supports_cloning
    stream = engine.synthesize("你好，世界。", voice="default", output_rate=24000)
    chunks = []
    async with asyncio.timeout(60):
        async for chunk in stream:
            chunks.append(chunk)
    assert len(chunks) >= 2 and all(c.dtype == np.int16 for c in chunks)  # streamed hop by hop
    direct_backend = make_backend(model, voices)
    direct = direct_backend.open_stream("你好，世界。", "default", 1.0)
    expected = audio(run(direct_backend, [direct])[0])
    assert expected.size == SAMPLES_PER_TOKEN * len(flow_tokens(direct)[0]) > 0
    got = np.concatenate(chunks)
    assert got.size == expected.size
    np.testing.assert_allclose(got / 32767.0, expected, atol=2e-4)  # the same speech, as int16
    slow = await read_all(engine.synthesize("你好，世界。", voice="default", output_rate=16000))
    assert abs(slow.size - expected.size * 2 / 3) <= 1


def test_concurrent_requests_are_batched_and_match_solo_runs(
    backend: CosyVoiceBackend, model: CosyVoice3, voices: VoiceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = ["你好。", "Hi.", "好的。"]
    solo_backend = make_backend(model, voices)
    solo_streams = [solo_backend.open_stream(text, "default", 1.0) for text in texts]
    solo = [audio(run(solo_backend, [stream])[0]) for stream in solo_streams]

    llm_batches: list[int] = []
    wave_batches: list[int] = []
    decode_step, wave_run = backend.runner.decode_step, model.token2wav.run
    monkeypatch.setattr(
        backend.runner, "decode_step", lambda rs: llm_batches.append(len(rs)) or decode_step(rs)
    )
    monkeypatch.setattr(model.token2wav, "run", lambda jobs: wave_batches.append(len(jobs)) or wave_run(jobs))
    streams = [backend.open_stream(text, "default", 1.0) for text in texts]
    batched = [audio(chunks) for chunks in run(backend, streams)]

    assert max(llm_batches) == 3 and max(wave_batches) >= 2  # really one batch per step
    assert [flow_tokens(s) for s in streams] == [flow_tokens(s) for s in solo_streams]
    for got, want in zip(batched, solo, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-3)
    assert backend.runner.num_free_slots == MAX_BATCH and backend.num_open_streams == 0


def test_hop_rows_per_step_are_capped_in_the_given_priority_order(
    model: CosyVoice3, voices: VoiceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = ["你好。", "早安。", "好的。"]
    solo_backend = make_backend(model, voices, fixed_llm_tokens=40)
    solo = [audio(run(solo_backend, [solo_backend.open_stream(t, "default", 1.0)])[0]) for t in texts]
    backend = make_backend(model, voices, fixed_llm_tokens=40, max_hop_rows=1)
    wave_batches: list[int] = []
    wave_run = model.token2wav.run
    monkeypatch.setattr(model.token2wav, "run", lambda jobs: wave_batches.append(len(jobs)) or wave_run(jobs))
    streams = [backend.open_stream(t, "default", 1.0) for t in texts]
    order = [2, 0, 1]  # the engine's ranking: stream 2 has the least slack
    first_audio_step: dict[int, int] = {}
    chunks: list[list[np.ndarray]] = [[] for _ in streams]
    live = list(order)
    for step in range(500):
        if not live:
            break
        for i, out in zip(list(live), backend.step([streams[i] for i in live]), strict=True):
            assert not isinstance(out, BaseException), out
            if out is None:
                streams[i].close()
                live.remove(i)
            elif out.size:
                first_audio_step.setdefault(i, step)
                chunks[i].append(out)
    assert not live and max(wave_batches) == 1
    assert backend.step_stats()["hops_deferred"] > 0
    # all three reach their first hop together; the cap serves them one per step, in rank order
    assert first_audio_step[2] < first_audio_step[0] < first_audio_step[1]
    for got, want in zip(chunks, solo, strict=True):
        np.testing.assert_allclose(audio(got), want, atol=1e-3)  # deferring a hop changes nothing


def test_prefills_per_step_follow_the_budget_in_the_given_order(backend: CosyVoiceBackend) -> None:
    streams = [backend.open_stream(t, "default", 1.0) for t in ("你好。", "早安。", "好的。")]
    order = [streams[2], streams[0], streams[1]]  # the engine's ranking
    backend.step(order, StepBudget(prefill_rows=1))
    assert backend.runner.num_free_slots == MAX_BATCH - 1 and streams[2].segments[0].llm.slot is not None
    assert backend.step_stats()["prefills_deferred"] == 2
    backend.step(order, StepBudget(prefill_rows=1))
    assert streams[0].segments[0].llm.slot is not None and streams[1].segments[0].llm.slot is None
    backend.step(order)  # no budget given: the declared limits (no prefill cap)
    assert backend.runner.num_free_slots == MAX_BATCH - 3
    assert backend.limits().max_streams == MAX_BATCH and backend.capacity() == MAX_BATCH
    for stream in streams:
        stream.close()
    assert backend.runner.num_free_slots == MAX_BATCH


def test_bad_hop_row_cap_is_refused(model: CosyVoice3, voices: VoiceStore) -> None:
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="max_hop_rows"):
            make_backend(model, voices, max_hop_rows=bad)


def test_static_shape_decode_runner_serves_the_backend_alike(
    model: CosyVoice3, voices: VoiceStore, caplog: pytest.LogCaptureFixture
) -> None:
    texts = ["你好。", "Hi."]
    plain = make_backend(model, voices)
    want = [audio(chunks) for chunks in run(plain, [plain.open_stream(t, "default", 1.0) for t in texts])]
    with caplog.at_level(logging.WARNING):
        backend = make_backend(model, voices, cuda_graphs=True)  # the CPU: ignored, with a warning
    assert not backend.cuda_graphs and "cuda_graphs" in caplog.text
    # the graph runner's static step (what CUDA would capture), eager on the CPU, as the backend's LLM
    backend.runner = backend.stepper.runner = GraphDecodeRunner(model.llm, max_batch=MAX_BATCH, max_len=512)
    streams = [backend.open_stream(t, "default", 1.0) for t in texts]
    got = [audio(chunks) for chunks in run(backend, streams)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-3)
    assert backend.runner.num_free_slots == MAX_BATCH


def test_closing_a_stream_frees_its_kv_slot_at_once(backend: CosyVoiceBackend) -> None:
    stream = backend.open_stream("你好。", "default", 1.0)
    other = backend.open_stream("早安。", "default", 1.0)
    for _ in range(5):
        assert [out.size for out in backend.step([stream, other])] == [0, 0]  # generating, no hop yet
    assert backend.runner.num_free_slots == MAX_BATCH - 2 and backend.num_open_streams == 2
    stream.close()
    assert backend.runner.num_free_slots == MAX_BATCH - 1 and stream.llm_request() is None
    assert isinstance(backend.step([stream])[0], Exception)  # a closed stream is refused
    assert audio(run(backend, [other])[0]).size > 0
    assert backend.runner.num_free_slots == MAX_BATCH and backend.num_open_streams == 0


async def test_engine_abort_frees_the_slot(engine: TTSEngine, backend: CosyVoiceBackend) -> None:
    stream = engine.synthesize("今天天气很好。", voice="default", output_rate=24000)
    async with asyncio.timeout(30):
        while stream.num_buffered == 0:  # the engine parks it at one unread chunk, its LLM unfinished
            await asyncio.sleep(0.01)
        assert backend.runner.num_free_slots == MAX_BATCH - 1
        await stream.aclose()
        while backend.runner.num_free_slots != MAX_BATCH or backend.num_open_streams:
            await asyncio.sleep(0.01)
    assert engine.stats["requests_aborted"] == 1


def test_a_failing_request_does_not_disturb_its_neighbours(
    backend: CosyVoiceBackend, model: CosyVoice3, voices: VoiceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    solo_backend = make_backend(model, voices)
    solo = audio(run(solo_backend, [solo_backend.open_stream("你好。", "default", 1.0)])[0])

    good, bad_prefill, bad_later = (
        backend.open_stream(t, "default", 1.0) for t in ("你好。", "是的。", "我们。")
    )
    doomed = bad_prefill.segments[0].llm.prompt
    embed = model.llm.embed_prompt

    def embed_or_fail(prompt):  # fails inside the batched prefill, for one row only
        if prompt is doomed:
            raise RuntimeError("injected prefill failure")
        return embed(prompt)

    monkeypatch.setattr(model.llm, "embed_prompt", embed_or_fail)
    wave = bad_later.segments[0].wave
    add_tokens = wave.add_tokens

    def add_or_fail(tokens):  # fails mid-stream, after its first hop
        if wave.hop_log:
            raise RuntimeError("injected token2wav failure")
        add_tokens(tokens)

    monkeypatch.setattr(wave, "add_tokens", add_or_fail)
    results = run(backend, [good, bad_prefill, bad_later])
    assert isinstance(results[1], RuntimeError) and "prefill" in str(results[1])
    assert isinstance(results[2], RuntimeError) and "token2wav" in str(results[2])
    np.testing.assert_allclose(audio(results[0]), solo, atol=1e-3)
    assert backend.runner.num_free_slots == MAX_BATCH


async def test_engine_fails_only_the_broken_request(
    engine: TTSEngine, backend: CosyVoiceBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend, "max_text_chars", 5)
    broken = engine.synthesize("这句话对后端来说太长了。", voice="default", output_rate=24000)
    fine = engine.synthesize("你好。", voice="default", output_rate=24000)
    with pytest.raises(SynthesisFailed, match="limit is 5"):
        await read_all(broken)
    assert (await read_all(fine)).size > 0


def test_instruct_mode_drops_the_prompt_speech_from_the_llm(
    backend: CosyVoiceBackend, model: CosyVoice3
) -> None:
    zero_shot = backend.open_stream("你好。", "default", 1.0)
    assert zero_shot.segments[0].llm.prompt.prompt_speech.numel() > 0
    by_request = backend.open_stream("你好。", "default", 1.0, instruct="用粤语说")
    by_preset = backend.open_stream("你好。", "styled", 1.0)
    for stream, instruction in ((by_request, "用粤语说"), (by_preset, "用四川话说")):
        prompt = stream.segments[0].llm.prompt
        assert prompt.prompt_speech.numel() == 0
        assert instruction in model.tokenizer.decode(prompt.prompt_text.tolist(), skip_special_tokens=False)
    zero_shot.close()
    outputs = [audio(chunks) for chunks in run(backend, [by_request, by_preset])]
    assert all(out.size > 0 for out in outputs)


def test_speed_time_scales_the_mel_offline(backend: CosyVoiceBackend) -> None:
    normal = backend.open_stream("你好。", "default", 1.0)
    fast = backend.open_stream("你好。", "default", 2.0)
    normal_chunks, fast_chunks = run(backend, [normal, fast])
    assert flow_tokens(fast) == flow_tokens(normal)  # same speech tokens, only the mel is scaled
    assert len(fast_chunks) == 1 and len(normal_chunks) > 1  # offline: one chunk once the LLM is done
    assert abs(audio(fast_chunks).size - audio(normal_chunks).size / 2) <= 480


def test_voices_are_cached_on_disk_and_checked(
    model: CosyVoice3, voices: VoiceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert any(voices.cache_dir.glob("default.*.safetensors"))

    def no_frontend(*args: object) -> None:
        raise AssertionError("prepared again instead of read from the cache")

    monkeypatch.setattr(model, "prepare_speaker", no_frontend)
    backend = make_backend(model, voices)  # every voice comes from its cache file
    assert backend.voices() == ["default", "styled"]
    with pytest.raises(VoiceError, match="unknown voice"):
        backend.open_stream("你好。", "nobody", 1.0)
    backend.remove_voice("styled")
    assert backend.voices() == ["default"]
    with pytest.raises(ValueError, match="KV cache"):
        make_backend(model, voices, max_llm_len=40).open_stream("你好。", "default", 1.0)
    assert (
        kv_cache_bytes(model, max_batch=2, max_len=9) == 2 * 10 * 2 * 2 * 2 * 6 * 4
    )  # layers, kv heads, dim


async def test_zero_shot_request_through_the_engine(engine: TTSEngine) -> None:
    stream = engine.synthesize_zero_shot(
        "你好。", prompt_wav=prompt_wav(3.0, 44100), prompt_text="一二三四五。"
    )
    assert (await read_all(stream)).size > 0


async def test_gateway_turn_with_the_tiny_model(
    model: CosyVoice3, voices: VoiceStore, tmp_path: Path
) -> None:
    voices_dir = tmp_path / "voices"
    voices_dir.mkdir()
    (voices_dir / "default.wav").write_bytes(prompt_wav())
    (voices_dir / "default.yaml").write_text(
        "prompt_wav: default.wav\nprompt_text: 你好。\n", encoding="utf-8"
    )
    backend = CosyVoiceBackend(model=model, seed=SEED, max_batch_size=2, max_llm_len=256,
                               voice_cache_dir=voices_dir / ".cache")  # fmt: skip
    overrides = {"tts": {"voices_dir": str(voices_dir)}, "audio": {"output_sample_rate": 24000}}
    async with running_gateway(overrides, backend=backend, llm=EchoLLM(chinese_prefix="", prefix="")) as gw:
        sim = DeviceSimulator(gw.url, protocol_version=1)
        await sim.connect()
        await sim.listen_start("auto")
        turn = await sim.ask("好。")
        await sim.close()
        assert gw.services.voices is not None and gw.services.voices.names() == ["default"]
        assert gw.services.engine.voices == ["default"]
    assert turn.sentences == ["好。"]
    audio_at = [i for i, e in enumerate(turn.events) if isinstance(e, AudioOut)]
    assert len(audio_at) >= 5 and audio_at[-1] < turn.events.index(
        next(e for e in turn.events if isinstance(e, TtsStop))
    )
    assert np.abs(turn.audio.astype(np.int32)).max() > 100
    assert list((voices_dir / ".cache").glob("default.*.safetensors"))  # prepared once, cached
