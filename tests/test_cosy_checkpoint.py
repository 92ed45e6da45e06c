from pathlib import Path

import pytest
import torch
from torch.nn.utils.parametrizations import weight_norm

from cosyvoice.checkpoint import (
    CheckpointError,
    check_keys,
    check_shapes,
    fold_weight_norm,
    load_module_state,
    load_state_dict,
    strip_prefix,
)


class Opaque:
    pass


def test_load_state_dict_round_trip(tmp_path: Path) -> None:
    state = {"a.weight": torch.randn(3, 4), "a.bias": torch.zeros(3)}
    torch.save(state, tmp_path / "m.pt")
    loaded = load_state_dict(tmp_path / "m.pt")
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[key], state[key]) for key in state)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (torch.zeros(3), "expected a state dict"),
        ({"a": torch.zeros(1), "step": 5}, "not tensors: step"),
        ({"a": Opaque()}, "cannot read checkpoint"),
    ],
)
def test_load_state_dict_rejects_other_payloads(tmp_path: Path, payload: object, message: str) -> None:
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=message) as info:
        load_state_dict(tmp_path / "bad.pt")
    assert info.value.file.endswith("bad.pt")


def test_load_state_dict_names_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"hift.pt: checkpoint file not found"):
        load_state_dict(tmp_path / "hift.pt")


def test_strip_prefix_only_touches_leading_prefix() -> None:
    state = {"generator.conv.weight": torch.ones(1), "m_source.generator.x": torch.ones(1)}
    assert set(strip_prefix(state, "generator.")) == {"conv.weight", "m_source.generator.x"}


@pytest.mark.parametrize(
    "conv",
    [torch.nn.Conv1d(6, 4, 5), torch.nn.ConvTranspose1d(6, 4, 5)],
    ids=["conv", "conv_transpose"],
)
def test_fold_weight_norm_matches_torch_for_both_key_styles(conv: torch.nn.Module) -> None:
    holder = torch.nn.Module()
    holder.conv = weight_norm(conv)
    with torch.no_grad():
        holder.conv.parametrizations.weight.original0.mul_(
            torch.rand_like(holder.conv.parametrizations.weight.original0) + 0.5
        )
    new_style = holder.state_dict()
    old_style = {
        key.replace("parametrizations.weight.original0", "weight_g").replace(
            "parametrizations.weight.original1", "weight_v"
        ): value
        for key, value in new_style.items()
    }
    for state in (new_style, old_style):
        folded = fold_weight_norm(state)
        assert set(folded) == {"conv.weight", "conv.bias"}
        assert torch.equal(folded["conv.weight"], holder.conv.weight.detach())


def test_fold_weight_norm_reports_half_pairs() -> None:
    with pytest.raises(CheckpointError, match=r"x.pt: weight norm of 'ups.0' has only v"):
        fold_weight_norm({"ups.0.parametrizations.weight.original1": torch.ones(2, 2, 2)}, file="x.pt")


def test_check_keys_lists_missing_and_unexpected() -> None:
    got = {"a": torch.zeros(1), "c": torch.zeros(1)}
    with pytest.raises(CheckpointError) as info:
        check_keys({"a", "b"}, got, "flow.pt")
    assert str(info.value) == "flow.pt: missing keys: b; unexpected keys: c"
    assert info.value.missing == ["b"] and info.value.unexpected == ["c"]
    check_keys({"a", "c"}, got, "flow.pt")


def test_check_shapes_names_the_key() -> None:
    with pytest.raises(CheckpointError, match=r"llm.pt: shape mismatch: w \(2, 3\) \(expected \(3, 2\)\)"):
        check_shapes({"w": (3, 2)}, {"w": torch.zeros(2, 3)}, "llm.pt")


def test_load_module_state_checks_then_loads() -> None:
    module = torch.nn.Linear(3, 2)
    source = torch.nn.Linear(3, 2)
    state = {**source.state_dict(), "lm_head.weight": torch.zeros(1)}
    with pytest.raises(CheckpointError, match="unexpected keys: lm_head.weight"):
        load_module_state(module, state, "m.pt")
    load_module_state(module, state, "m.pt", ignore=["lm_head.weight"])
    assert torch.equal(module.weight, source.weight)
    with pytest.raises(CheckpointError, match="shape mismatch: bias"):
        load_module_state(module, {"weight": source.weight, "bias": torch.zeros(5)}, "m.pt")
