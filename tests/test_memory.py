"""The engine's memory budget: parsing engine.gpu_memory_gib and planning the KV pool."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tts_engine.memory import GIB, MemoryBudget, MemoryBudgetError, device_total_bytes, module_bytes


def test_absolute_gib_and_fractions_of_the_device() -> None:
    assert MemoryBudget.from_gib(6, "cpu").total_bytes == 6 * GIB
    assert MemoryBudget.from_gib(1.5, "cpu").total_bytes == int(1.5 * GIB)
    host = device_total_bytes("cpu")
    assert host > 0
    assert MemoryBudget.from_gib(0.25, "cpu").total_bytes == int(0.25 * host)
    assert MemoryBudget.from_gib(1, "cpu").total_bytes == host  # 1 is the whole device


@pytest.mark.parametrize("value", [0, -2, float("nan"), float("inf"), "6", True])
def test_bad_budgets_name_the_config_key(value: object) -> None:
    with pytest.raises(MemoryBudgetError, match="engine.gpu_memory_gib"):
        MemoryBudget.from_gib(value, "cpu")  # type: ignore[arg-type]


def test_plan_fills_the_budget_after_the_weights_with_whole_rows() -> None:
    budget = MemoryBudget(1000)
    plan = budget.plan(
        weights_bytes=300, kv_bytes_per_slot=150, activation_bytes_per_row=50, max_batch_size=16
    )
    assert plan.num_slots == 3  # (1000 - 300) // 200
    assert plan.kv_pool_bytes == 450 and plan.reserve_bytes == 150
    assert plan.planned_bytes == 900 <= budget.total_bytes
    stats = plan.as_stats()
    assert stats["memory_budget_bytes"] == 1000 and stats["num_slots"] == 3
    capped = budget.plan(weights_bytes=0, kv_bytes_per_slot=1, activation_bytes_per_row=0, max_batch_size=4)
    assert capped.num_slots == 4


@pytest.mark.parametrize("weights", [1000, 1200, 950])
def test_a_budget_without_room_for_one_stream_is_a_clear_startup_error(weights: int) -> None:
    with pytest.raises(MemoryBudgetError, match="engine.gpu_memory_gib.*cannot hold the weights"):
        MemoryBudget(1000).plan(
            weights_bytes=weights, kv_bytes_per_slot=80, activation_bytes_per_row=20, max_batch_size=4
        )


def test_module_bytes_counts_parameters_and_buffers_once() -> None:
    linear = nn.Linear(10, 4)  # 44 float32 values
    model = nn.Sequential(linear, linear)  # shared: counted once
    model.register_buffer("table", torch.zeros(6, dtype=torch.float16))
    assert module_bytes(model) == 44 * 4 + 6 * 2
    assert module_bytes(model, linear) == 44 * 4 + 6 * 2
