"""A flow call's prepared inputs (``Flow._prepare``) and a flow call under way (``Flow.begin_inference``)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from torch import Tensor

from .cfm import EulerSolve


@dataclass(frozen=True, eq=False)
class Prepared:
    """What a flow call's solve reads and what the output gather needs."""

    batch: int
    mu: Tensor  # [B, T, 80]
    cond: Tensor  # [B, T, 80]
    spk: Tensor  # [B, 80]
    frames: list[int]
    stream: list[bool]
    fin: list[bool]
    p_len: list[int]
    f_len: list[int]
    out_pos: Tensor  # [1, Mmax]
    out_valid: Tensor  # [B, Mmax, 1]
    f_b: Tensor  # [B, 1]
    t_max: int


@dataclass(eq=False)
class FlowSolve:
    """A flow call under way (:meth:`Flow.begin_inference`)."""

    prep: Prepared
    euler: EulerSolve | None  # without caches; None: ``steps``, the solve with caches
    steps: Generator[None, None, Tensor] | None = None
    feat: Tensor | None = None  # ``steps``' result once done

    @property
    def done(self) -> bool:
        return self.euler.done if self.euler is not None else self.feat is not None
