"""The GPU memory plan: the config split, the process cap and the ASR's share check."""

from __future__ import annotations

import pytest
import torch

from gateway.asr.gpu_share import GIB, CudaMeter, MemoryUse, apply_process_cap, check_share, resolve_device
from gateway.config import ConfigError, GPUConfig, load_config


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


def test_the_process_cap_is_the_plan_over_the_device_total(monkeypatch):
    calls = []

    class Props:
        total_memory = 80 * GIB

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, index: calls.append((f, index))
    )
    assert apply_process_cap(GPUConfig(memory_gib=20, asr_memory_gib=2), "cuda") == pytest.approx(0.25)
    assert apply_process_cap(GPUConfig(memory_gib=200, asr_memory_gib=2), "cuda:1") == 1.0
    assert calls == [(pytest.approx(0.25), 0), (1.0, 1)]


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
