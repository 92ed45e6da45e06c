"""The FunASR backend: the real FunASR code path on a tiny generated model, and its batching."""

from __future__ import annotations

import asyncio
import importlib.machinery
import shutil
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from gateway.asr import (
    ASRBusy,
    ASRInputError,
    ASRLoadError,
    ASRModelMissing,
    ASRNotConfigured,
    create_asr,
    funasr_backend,
)
from gateway.asr.base import NotConfiguredASR
from gateway.asr.funasr_backend import FunASRBackend, clean_text
from gateway.config import ASRConfig
from gateway.xiaozhi import Stt, TtsStart
from scripts.device_sim import DeviceSimulator
from scripts.make_tiny_funasr_model import make_tiny_model
from scripts.speech import utterance
from tests.gateway_server import running_gateway
from tts_engine.backends.fake import FakeBackend


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-sensevoice"), says="你好")


@pytest.fixture(scope="module")
def tiny_backend(tiny_model: Path):
    backend = create_asr(ASRConfig(backend="funasr", model=str(tiny_model), max_batch=4))
    yield backend
    asyncio.run(backend.aclose())


# ---- the real FunASR code path -----------------------------------------------------


async def test_tiny_model_recognises_through_funasr(tiny_backend):
    assert isinstance(tiny_backend, FunASRBackend) and tiny_backend.device == "cpu"
    speech = utterance("Hello, how are you today?", lead_s=0.3, tail_s=0.3).pcm
    assert await tiny_backend.transcribe(speech) == "你好"
    # FunASR's own output carries SenseVoice's tags; the backend removes them
    raw = tiny_backend._model.generate(input=[speech.astype(np.float32) / 32768], disable_pbar=True)
    assert raw[0]["text"].startswith("<|zh|><|NEUTRAL|>") and raw[0]["text"].endswith("你好")


async def test_tiny_model_batches_concurrent_utterances(tiny_backend):
    speech = utterance("What time is it?", lead_s=0.2, tail_s=0.2).pcm
    before = tiny_backend.stats
    texts = await asyncio.gather(
        *(tiny_backend.transcribe(speech[: speech.size - 800 * i]) for i in range(6))
    )
    after = tiny_backend.stats
    assert texts == ["你好"] * 6
    assert after["requests"] - before["requests"] == 6
    assert after["batches"] - before["batches"] < 6  # some ran together
    assert after["max_batch"] >= 2


def test_auto_uses_funasr_when_the_model_is_there(tiny_model: Path):
    asr = create_asr(ASRConfig(backend="auto", model=str(tiny_model)))
    assert isinstance(asr, FunASRBackend)
    asyncio.run(asr.aclose())


def test_a_model_found_in_the_modelscope_cache_is_used(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path))
    shutil.copytree(tiny_model, tmp_path / "models" / "iic" / "SenseVoiceSmall")
    where = FunASRBackend.locate_model(ASRConfig(model="iic/SenseVoiceSmall", download=False))
    assert Path(where) == tmp_path / "models" / "iic" / "SenseVoiceSmall"


async def test_speech_to_a_gateway_is_recognised_by_funasr(tiny_model: Path):
    vad = {"min_silence_ms": 400, "detect_mute_s": 0.5}
    speech = utterance("What is the weather like today?", lead_s=0.3, tail_s=0.8)
    config = {"asr": {"backend": "funasr", "model": str(tiny_model), "vad": vad}}
    async with running_gateway(config, backend=FakeBackend(ms_per_char=10.0)) as gw:
        assert gw.services.asr.name == "funasr"
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("auto")
        t = time.monotonic()
        await sim.send_speech(speech.pcm)
        turn = await sim.collect_turn(t, timeout=20)
        await sim.close()
    assert turn.stt == "你好"
    assert isinstance(turn.events[0], Stt) and isinstance(turn.events[1], TtsStart)
    assert "你好" in "".join(turn.sentences)  # the echo LLM answered the recognised text


# ---- clear failures, never a hang --------------------------------------------------


def test_missing_model_is_a_clear_startup_error(tmp_path, tiny_model, monkeypatch):
    with pytest.raises(ASRModelMissing, match="no model directory"):
        create_asr(ASRConfig(backend="funasr", model=str(tmp_path / "nope")))
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(tiny_model / "config.yaml", partial / "config.yaml")
    shutil.copy(tiny_model / "configuration.json", partial / "configuration.json")
    with pytest.raises(ASRModelMissing, match="model.pt is missing"):
        create_asr(ASRConfig(backend="funasr", model=str(partial)))
    with pytest.raises(ASRModelMissing, match="config.yaml is missing"):
        create_asr(ASRConfig(backend="funasr", model=str(tmp_path)))
    # a hub id that is not downloaded, with nothing to download it
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(funasr_backend, "find_spec", lambda name: None)
    with pytest.raises(ASRModelMissing, match="pip install modelscope"):
        create_asr(ASRConfig(backend="funasr", model="iic/SenseVoiceSmall"))
    with pytest.raises(ASRModelMissing, match="asr.download is off"):
        create_asr(ASRConfig(backend="funasr", model="iic/SenseVoiceSmall", download=False))


async def test_missing_model_can_mean_the_spoken_notice(tmp_path):
    for cfg in (
        ASRConfig(backend="funasr", model=str(tmp_path / "nope"), on_load_failure="not_configured"),
        ASRConfig(backend="auto", model=str(tmp_path / "nope")),
    ):
        asr = create_asr(cfg)
        assert isinstance(asr, NotConfiguredASR) and "no model directory" in (asr.warning or "")
        with pytest.raises(ASRNotConfigured):
            await asr.transcribe(np.zeros(16000, np.int16))
    assert create_asr("none").warning is None


# ---- a fake funasr module: the arguments we give it and our batching -----------------


class FakeAutoModel:
    instances: list[FakeAutoModel] = []
    build_delay_s = 0.0
    fail_generate = False

    def __init__(self, **kwargs) -> None:
        time.sleep(self.build_delay_s)
        self.kwargs = kwargs
        self.calls: list[dict] = []
        self.gate = threading.Event()
        self.gate.set()
        FakeAutoModel.instances.append(self)

    def generate(self, input, **cfg):
        self.gate.wait(5)
        if self.fail_generate:
            raise RuntimeError("CUDA error: something broke")
        self.calls.append({"n": len(input), "threads": torch.get_num_threads(), **cfg})
        return [
            {"key": f"k{i}", "text": f"<|en|><|HAPPY|><|Speech|><|woitn|>{x.size} samples"}
            for i, x in enumerate(input)
        ]


@pytest.fixture
def fake_funasr(monkeypatch, tmp_path):
    module = types.ModuleType("funasr")
    module.__spec__ = importlib.machinery.ModuleSpec("funasr", None)
    module.AutoModel = FakeAutoModel
    monkeypatch.setitem(sys.modules, "funasr", module)
    FakeAutoModel.instances = []
    FakeAutoModel.build_delay_s = 0.0
    FakeAutoModel.fail_generate = False
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text("model: SenseVoiceSmall\n")
    (model_dir / "model.pt").write_bytes(b"weights")
    return model_dir


async def test_automodel_gets_local_offline_arguments(fake_funasr):
    cfg = ASRConfig(backend="funasr", model=str(fake_funasr), language="zh", use_itn=False, threads=1)
    threads = torch.get_num_threads()
    asr = create_asr(cfg)
    assert torch.get_num_threads() == threads  # loading left this thread's setting alone
    (model,) = FakeAutoModel.instances
    assert model.kwargs["model"] == str(fake_funasr)
    assert model.kwargs["disable_update"] is True and model.kwargs["disable_pbar"] is True
    assert model.kwargs["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert model.kwargs["ncpu"] == 1
    assert await asr.transcribe(np.zeros(8000, np.int16)) == "8000 samples"
    call = model.calls[-1]
    assert call["language"] == "zh" and call["use_itn"] is False and call["batch_size"] == call["n"] == 1
    assert call["threads"] == 1  # recognition runs with asr.threads torch threads
    await asr.aclose()


async def test_sessions_are_batched_and_each_gets_its_own_text(fake_funasr):
    asr = create_asr(ASRConfig(backend="funasr", model=str(fake_funasr), max_batch=4))
    (model,) = FakeAutoModel.instances
    model.calls.clear()
    model.gate.clear()
    first = asyncio.create_task(asr.transcribe(np.zeros(1600, np.int16)))
    await asyncio.sleep(0.05)
    sizes = [3200, 4800, 6400, 8000, 9600]
    others = [asyncio.create_task(asr.transcribe(np.zeros(n, np.int16))) for n in sizes]
    await asyncio.sleep(0.05)
    model.gate.set()
    assert await first == "1600 samples"
    assert await asyncio.gather(*others) == [f"{n} samples" for n in sizes]
    assert [c["n"] for c in model.calls] == [1, 4, 1]
    assert all(c["batch_size"] == c["n"] for c in model.calls)
    await asr.aclose()


async def test_a_full_queue_is_busy_and_short_audio_is_not_sent(fake_funasr):
    asr = create_asr(ASRConfig(backend="funasr", model=str(fake_funasr), max_batch=1, max_queue=1))
    (model,) = FakeAutoModel.instances
    calls = len(model.calls)
    assert await asr.transcribe(np.zeros(800, np.int16)) == ""  # 50 ms: not worth a model call
    assert len(model.calls) == calls
    model.gate.clear()
    running = asyncio.create_task(asr.transcribe(np.zeros(16000, np.int16)))
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(asr.transcribe(np.zeros(16000, np.int16)))
    await asyncio.sleep(0.01)
    with pytest.raises(ASRBusy):
        await asr.transcribe(np.zeros(16000, np.int16))
    model.gate.set()
    assert await running == await queued == "16000 samples"
    await asr.aclose()


async def test_bad_audio_is_a_typed_error(fake_funasr):
    asr = create_asr(ASRConfig(backend="funasr", model=str(fake_funasr)))
    for bad in (np.zeros(16000, np.float32), np.zeros((2, 16000), np.int16), b"\x00\x00"):
        with pytest.raises(ASRInputError):
            await asr.transcribe(bad)  # type: ignore[arg-type]
    await asr.aclose()


def test_a_hanging_load_times_out(fake_funasr):
    FakeAutoModel.build_delay_s = 3.0
    t0 = time.monotonic()
    with pytest.raises(ASRLoadError, match="did not finish within 0.3 s"):
        create_asr(ASRConfig(backend="funasr", model=str(fake_funasr), load_timeout_s=0.3))
    assert time.monotonic() - t0 < 1.5


def test_a_model_that_cannot_recognise_fails_at_startup(fake_funasr):
    FakeAutoModel.fail_generate = True
    with pytest.raises(ASRLoadError, match="cannot recognise: CUDA error"):
        create_asr(ASRConfig(backend="funasr", model=str(fake_funasr)))
    asr = create_asr(ASRConfig(backend="funasr", model=str(fake_funasr), on_load_failure="not_configured"))
    assert isinstance(asr, NotConfiguredASR) and "CUDA error" in (asr.warning or "")


def test_funasr_build_errors_are_wrapped(fake_funasr, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("model 'SenseVoiceSmall' is not registered.\nRegistered model keys: ...")

    monkeypatch.setattr(sys.modules["funasr"], "AutoModel", broken)
    with pytest.raises(
        ASRLoadError, match="cannot build the model .*: model 'SenseVoiceSmall' is not registered.$"
    ):
        create_asr(ASRConfig(backend="funasr", model=str(fake_funasr)))


def test_clean_text_removes_rich_tags():
    assert clean_text("<|zh|><|NEUTRAL|><|Speech|><|withitn|>今天天气怎么样？") == "今天天气怎么样？"
    assert clean_text("<|en|><|HAPPY|><|BGM|><|woitn|> hello   world ") == "hello world"
    assert clean_text("<|nospeech|><|EMO_UNKNOWN|><|Event_UNK|><|woitn|>") == ""
    assert clean_text("a <b> c") == "a <b> c"
