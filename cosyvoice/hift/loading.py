"""Fold an official ``hift.pt`` for :class:`~cosyvoice.hift.CausalHift`.

Weight norm is folded with the checkpoint helpers; the f0 predictor's pairs are folded in float64, as
upstream evaluates its parametrization after casting the module to float64. Building the vocoder of a
model directory (its fixed noise buffers replayed from the official construction order, see
:mod:`cosyvoice.hift.buffers`) is :func:`cosyvoice.pretrained.load_hift`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from cosyvoice.checkpoint import fold_weight_norm, strip_prefix
from cosyvoice.hift.f0 import F0_DTYPE

__all__ = ["fold_hift_state"]


def fold_hift_state(state_dict: Mapping[str, torch.Tensor], file: str | Path) -> dict[str, torch.Tensor]:
    """Strip an optional ``generator.`` prefix and fold weight norm (f0 predictor in float64)."""
    state = strip_prefix(state_dict, "generator.")
    f0_part = {k: v.to(F0_DTYPE) for k, v in state.items() if k.startswith("f0_predictor.")}
    rest = {k: v for k, v in state.items() if not k.startswith("f0_predictor.")}
    return {**fold_weight_norm(rest, file=file), **fold_weight_norm(f0_part, file=file)}
