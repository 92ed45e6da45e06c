"""Repetition-aware sampling (RAS) of speech tokens and the CosyVoice3 silent-token filter.

Every draw goes through ``torch.multinomial`` with the request's own CPU ``torch.Generator``,
in the same order and on tensors of the same length as the reference sampler, so a request
seeded with ``seed`` yields the same tokens as the reference run after
``torch.manual_seed(seed)``, whatever else shares its batch.

One step: softmax the log-probs, stable descending sort, keep candidates while the running
probability (accumulated in fp32) is below ``top_p`` and fewer than ``top_k`` are kept (so the
crossing token is kept), draw one of them without renormalising. If that id already occurs in
the last ``win_size`` emitted tokens at least ``win_size * tau_r`` times, mask it and draw again
from the full distribution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

SILENT_TOKENS: frozenset[int] = frozenset({1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323})
MAX_SILENT_RUN = 5


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RasParams:
    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.win_size < 0 or self.tau_r < 0:
            raise ValueError("win_size and tau_r must be non-negative")


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator in the state ``torch.manual_seed(seed)`` leaves the global one in."""
    return torch.Generator(device="cpu").manual_seed(seed)


def stable_top_k(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` entries of ``probs.sort(descending=True, stable=True)`` (values, ids), without
    sorting the whole vocabulary (a full sort of 6761 rows is most of a small model's decode step).

    ``topk`` finds the k-th largest value ``v``; the kept ids are every id above ``v`` plus the
    lowest-numbered ids equal to ``v`` up to ``k``, ordered by a stable sort of those few: the same
    ids in the same order as the full stable sort, ties included. NaN falls back to the full sort.
    """
    k = min(k, probs.numel())
    kth = torch.topk(probs, k, sorted=False).values.min()
    if bool(torch.isnan(kth)):
        values, ids = probs.sort(descending=True, stable=True)
        return values[:k], ids[:k]
    above = (probs > kth).nonzero()[:, 0]  # [< k] ascending ids
    ties = (probs == kth).nonzero()[:, 0][: k - above.numel()]  # ascending ids, all below ``above``
    ids = torch.cat([above, ties])  # [k]
    values, order = probs[ids].sort(descending=True, stable=True)
    return values, ids[order]


def stable_top_k_rows(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``stable_top_k`` of every row of ``probs`` [B, V] at once: (values, ids), each [B, k]; None when
    a row holds NaN (then take each row through ``stable_top_k``).

    Each row keeps the ids above its k-th largest value plus its lowest-numbered ids equal to it, k in
    all, in ascending id order (``nonzero`` walks row by row), then a stable descending sort of those
    k: the same ids in the same order as ``stable_top_k`` on the row, one call for the whole batch.
    """
    rows, vocab = probs.shape
    k = min(k, vocab)
    kth = torch.topk(probs, k, dim=1, sorted=False).values.min(dim=1, keepdim=True).values  # [B, 1]
    if bool(torch.isnan(kth).any()):
        return None
    above = probs > kth  # [B, V], fewer than k a row
    ties = probs == kth  # [B, V], at least one a row
    room = k - above.sum(dim=1, keepdim=True)  # [B, 1]: the ties each row keeps, lowest ids first
    keep = above | (ties & (ties.cumsum(dim=1) <= room))  # [B, V], exactly k a row
    ids = keep.nonzero()[:, 1].view(rows, k)  # [B, k] ascending ids
    values, order = probs.gather(1, ids).sort(dim=1, descending=True, stable=True)
    return values, ids.gather(1, order)


def nucleus_candidates(probs: torch.Tensor, top_p: float, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept (probabilities, ids) of a 1-D fp32 CPU probability vector, most likely first."""
    return nucleus_cut(*stable_top_k(probs, top_k), top_p)


def nucleus_cut(
    sorted_probs: torch.Tensor, sorted_ids: torch.Tensor, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head of the top-k candidates (most likely first) that ``top_p`` keeps."""
    head = sorted_probs.numpy()  # [<= top_k]
    # running sums exactly as a left-to-right fp32 accumulation (numpy accumulate is sequential)
    running = np.cumsum(head, dtype=np.float32)  # [<= top_k]
    # token i is kept while the sum of the tokens before it is still below top_p
    num_kept = 1 + int(np.count_nonzero(running[: head.size - 1] < np.float32(top_p)))
    return sorted_probs[:num_kept], sorted_ids[:num_kept]


def ras_sample(
    logp: torch.Tensor,
    history: Sequence[int],
    generator: torch.Generator,
    params: RasParams = RasParams(),
) -> int:
    """Draw one id from ``logp`` (1-D fp32 CPU log-probabilities, may hold -inf).

    ``history`` is the list of tokens emitted so far by this request; only its last
    ``params.win_size`` entries matter. ``logp`` is not modified.
    """
    if logp.dim() != 1 or logp.device.type != "cpu" or logp.dtype != torch.float32:
        raise ValueError(f"logp must be a 1-D float32 CPU tensor, got {tuple(logp.shape)} {logp.dtype}")
    cand_probs, cand_ids = nucleus_candidates(logp.softmax(dim=0), params.top_p, params.top_k)
    return _draw(cand_probs, cand_ids, logp, history, generator, params)


def ras_sample_rows(
    logp: torch.Tensor,
    histories: Sequence[Sequence[int]],
    generators: Sequence[torch.Generator],
    params: RasParams = RasParams(),
) -> list[int] | None:
    """``ras_sample`` of each row of ``logp`` [B, V] with its own history and generator, all with the
    same ``params``: the same ids, draw for draw, with the softmax and the top-k of every row found in
    one call each (per row they were most of a batched decode step's cost a row on a CPU). None, with
    no generator touched, when a row holds NaN: then draw row by row (``ras_sample``), so that only the
    rows that cannot be drawn fail."""
    if logp.dim() != 2 or logp.device.type != "cpu" or logp.dtype != torch.float32:
        raise ValueError(f"logp must be a 2-D float32 CPU tensor, got {tuple(logp.shape)} {logp.dtype}")
    top = stable_top_k_rows(logp.softmax(dim=1), params.top_k)
    if top is None:
        return None
    return [
        _draw(*nucleus_cut(top[0][row], top[1][row], params.top_p), logp[row], history, generator, params)
        for row, (history, generator) in enumerate(zip(histories, generators, strict=True))
    ]


def _draw(
    cand_probs: torch.Tensor,
    cand_ids: torch.Tensor,
    logp: torch.Tensor,
    history: Sequence[int],
    generator: torch.Generator,
    params: RasParams,
) -> int:
    """One draw among the candidates; a repeat too frequent in the window is drawn again from ``logp``."""
    token = int(cand_ids[torch.multinomial(cand_probs, 1, replacement=True, generator=generator)].item())
    window = list(history[-params.win_size :]) if params.win_size > 0 else []
    if window.count(token) >= params.win_size * params.tau_r:
        masked = logp.clone()
        masked[token] = -float("inf")
        token = int(torch.multinomial(masked.softmax(dim=0), 1, replacement=True, generator=generator).item())
    return token


class SilentTokenFilter:
    """Drops silent tokens from the flow input once more than ``max_run`` follow each other.

    The LLM keeps every token in its own context and RAS history; only the flow sees the
    filtered stream. Any non-silent token resets the run.
    """

    def __init__(self, silent_tokens: frozenset[int] = SILENT_TOKENS, max_run: int = MAX_SILENT_RUN) -> None:
        self.silent_tokens = silent_tokens
        self.max_run = max_run
        self._run = 0

    def accept(self, token: int) -> bool:
        """Register ``token``; True when it should be passed on to the flow."""
        if token not in self.silent_tokens:
            self._run = 0
            return True
        self._run += 1
        return self._run <= self.max_run
