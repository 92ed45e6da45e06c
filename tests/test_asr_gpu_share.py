"""The GPU memory plan: the config split, the process cap and the ASR's share check."""

from __future__ import annotations

import pytest
import torch

from gateway.asr.gpu_share import (
    GIB,
    CudaMeter,
    MemoryUse,
    apply_process_cap,
    check_share,
    resolve_device,
)
from gateway.config import ConfigError, GPUConfig, load_config
from tts_engine.gpu_share import apply_engine_share, reset_gpu_shares


def in_process_engine(gpu: GPUConfig, engine_gpu_memory_gib: float | None, device: str) -> float | None:
    """The claim tts_engine/build.py makes for an engine in the gateway's own process."""
    return apply_engine_share(
        device,
        memory_gib=gpu.memory_gib,
        asr_memory_gib=gpu.asr_memory_gib,
        engine_gpu_memory_gib=engine_gpu_memory_gib,
        own_process=False,
    )


@pytest.fixture(autouse=True)
def _fresh_claims():
    reset_gpu_shares()
    yield
    reset_gpu_shares()


@pytest.fixture
def fake_gpu(monkeypatch) -> list[tuple[float, int]]:
    """An 80 GiB device; the fractions set on it, in order."""
    calls: list[tuple[float, int]] = []

    class Props:
        total_memory = 80 * GIB

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, index: calls.append((f, index))
    )
    return calls


def test_the_split_is_validated_and_the_tts_gets_the_rest():
    cfg = load_config(environ={}, overrides={"gpu": {"memory_gib": 20, "asr_memory_gib": 2.5}})
    assert cfg.gpu.tts_memory_gib == pytest.approx(17.5)
    assert GPUConfig().tts_memory_gib is None  # no plan: no cap
    with pytest.raises(ConfigError, match="asr_memory_gib must be smaller"):
        load_config(environ={}, overrides={"gpu": {"memory_gib": 2, "asr_memory_gib": 2}})
    env = load_config(environ={"XZ_GPU__MEMORY_GIB": "40"})
    assert env.gpu.memory_gib == 40


def test_no_cap_on_cpu_or_without_a_plan():
    assert apply_process_cap(GPUConfig(memory_gib=10), "cpu") is None
    assert apply_process_cap(GPUConfig(), "cuda") is None
    assert apply_process_cap(None, "cuda") is None


def test_engine_in_process_the_cap_is_the_whole_plan_whichever_loads_first(fake_gpu):
    plan = GPUConfig(memory_gib=20, asr_memory_gib=2)
    assert apply_process_cap(plan, "cuda") == pytest.approx(2 / 80)  # the ASR first: its share alone
    assert in_process_engine(plan, None, "cuda") == pytest.approx(0.25)  # then the engine: the plan
    reset_gpu_shares()
    assert in_process_engine(plan, 10.0, "cuda:1") == pytest.approx(18 / 80)  # the TTS part of the plan
    assert apply_process_cap(plan, "cuda:1") == pytest.approx(0.25)
    big = GPUConfig(memory_gib=200, asr_memory_gib=2)
    assert apply_process_cap(big, "cuda:2") is not None and in_process_engine(big, None, "cuda:2") == 1.0
    assert fake_gpu[-1] == (1.0, 2)


def test_each_process_caps_only_itself(fake_gpu):
    plan = GPUConfig(memory_gib=20, asr_memory_gib=2)
    # the gateway with the engine in workers holds the ASR only
    assert apply_process_cap(plan, "cuda") == pytest.approx(2 / 80)
    reset_gpu_shares()  # an engine worker is another process: its own claims
    assert apply_engine_share("cuda", memory_gib=20, asr_memory_gib=2) == pytest.approx(18 / 80)
    reset_gpu_shares()
    assert apply_engine_share("cuda", engine_gpu_memory_gib=8.0) == pytest.approx(0.1)  # no plan: its budget
    reset_gpu_shares()
    assert apply_engine_share("cuda", engine_gpu_memory_gib=0.3) == pytest.approx(0.3)  # a fraction
    reset_gpu_shares()
    assert apply_engine_share("cuda") is None  # nothing to cap at
    assert apply_engine_share("cpu", memory_gib=20, asr_memory_gib=2) is None
    assert fake_gpu == [
        (pytest.approx(2 / 80), 0),
        (pytest.approx(18 / 80), 0),
        (pytest.approx(0.1), 0),
        (0.3, 0),
    ]


def test_without_a_plan_the_gateway_process_stays_uncapped(fake_gpu):
    assert in_process_engine(GPUConfig(), 8.0, "cuda") is None  # today's in-process behaviour
    assert apply_process_cap(GPUConfig(), "cuda") is None
    assert fake_gpu == []


def test_device_choice(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cuda:0") == "cpu"  # with a warning
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"


def test_share_check_warns_when_the_measurement_exceeds_the_share():
    plan = GPUConfig(memory_gib=20, asr_memory_gib=2)
    assert check_share(plan, MemoryUse(kept_gib=0.9), MemoryUse(peak_gib=0.8)) is None
    warning = check_share(plan, MemoryUse(kept_gib=0.9), MemoryUse(peak_gib=1.5))
    assert warning is not None and "2.40 GiB" in warning and "max_batch_audio_s" in warning
    assert check_share(None, MemoryUse(kept_gib=9), MemoryUse(peak_gib=9)) is None


def test_the_meter_is_a_no_op_on_cpu():
    with CudaMeter("cpu") as meter:
        torch.zeros(1000)
    assert meter.use == MemoryUse() and not meter.cuda
