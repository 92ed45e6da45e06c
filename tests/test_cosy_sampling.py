"""Speech-token sampling of the CosyVoice3 LM (cosyvoice/llm/sampling.py): nucleus, top-k, RAS, batches."""

from __future__ import annotations

import pytest
import torch

from cosyvoice.llm.sampling import (
    RasParams,
    SilentTokenFilter,
    make_generator,
    nucleus_candidates,
    ras_sample,
    ras_sample_rows,
    stable_top_k,
    stable_top_k_rows,
)

# ---------------------------------------------------------------- sampling


def test_nucleus_keeps_crossing_token_and_respects_top_k() -> None:
    probs = torch.tensor([0.1, 0.5, 0.2, 0.2])
    kept_p, kept_ids = nucleus_candidates(probs, top_p=0.8, top_k=25)
    assert kept_ids.tolist() == [1, 2, 3] and kept_p.tolist() == pytest.approx([0.5, 0.2, 0.2])
    assert nucleus_candidates(probs, top_p=0.8, top_k=2)[1].tolist() == [1, 2]
    assert nucleus_candidates(probs, top_p=0.4, top_k=25)[1].tolist() == [1]
    ties = torch.full((5,), 0.2)
    assert nucleus_candidates(ties, top_p=0.5, top_k=25)[1].tolist() == [0, 1, 2]  # stable order


def test_top_k_equals_the_head_of_the_full_stable_sort() -> None:
    gen = torch.Generator().manual_seed(7)
    cases = [torch.rand(6761, generator=gen) for _ in range(20)]
    # ties across the k-th place: few distinct values, so many ids share the cut-off value
    cases += [torch.randint(0, 6, (6761,), generator=gen).float() / 5 for _ in range(20)]
    cases += [torch.zeros(6761), torch.tensor([0.3, 0.3, 0.1]), torch.full((4,), 0.25)]
    for probs in cases:
        for k in (1, 2, 25, 100):
            values, ids = stable_top_k(probs, k)
            want_values, want_ids = probs.sort(descending=True, stable=True)
            assert ids.tolist() == want_ids[: min(k, probs.numel())].tolist()
            assert values.tolist() == want_values[: min(k, probs.numel())].tolist()


def test_top_k_of_a_batch_equals_each_rows_top_k() -> None:
    gen = torch.Generator().manual_seed(8)
    batches = [torch.rand(6, 6761, generator=gen), (torch.randint(0, 6, (6, 6761), generator=gen).float() / 5)]
    batches += [torch.zeros(3, 40), torch.tensor([[0.3, 0.3, 0.1], [0.1, 0.1, 0.1]])]  # all ties; k > V
    sparse = torch.zeros(4, 500)
    sparse[:, :3] = torch.tensor([0.5, 0.3, 0.2])  # fewer than k non-zero: zeros fill up, lowest ids first
    batches.append(sparse)
    for probs in batches:
        for k in (1, 2, 25, 100):
            values, ids = stable_top_k_rows(probs, k)  # type: ignore[misc]
            for row in range(probs.shape[0]):
                want_values, want_ids = stable_top_k(probs[row], k)
                assert ids[row].tolist() == want_ids.tolist() and values[row].tolist() == want_values.tolist()
    probs = torch.rand(3, 50, generator=gen)
    probs[1, 7] = float("nan")
    assert stable_top_k_rows(probs, 25) is None
    # the batch's softmax is each row's, bit for bit, at the LM's vocabulary (ras_sample_rows relies on it)
    logp = (torch.randn(16, 6761, generator=gen) * 3).log_softmax(-1)
    assert all(torch.equal(logp.softmax(dim=1)[k], logp[k].softmax(dim=0)) for k in range(16))


def test_a_batch_draws_what_each_row_draws_alone() -> None:
    """``ras_sample_rows`` (the runner's batched path) against ``ras_sample`` row by row: the same ids,
    generators left in the same state, over steps with ties, masked stops and repetition redraws."""
    gen = torch.Generator().manual_seed(9)
    params = RasParams(top_p=0.8, top_k=25, win_size=4, tau_r=0.5)  # repeats redrawn often
    seeds = [21, 22, 23, 24, 25]
    solo_gens, batch_gens = [make_generator(s) for s in seeds], [make_generator(s) for s in seeds]
    solo_hist: list[list[int]] = [[] for _ in seeds]
    batch_hist: list[list[int]] = [[] for _ in seeds]
    for step in range(60):
        logits = torch.randn(len(seeds), 300, generator=gen) * (1 + step % 4)
        if step % 3 == 0:
            logits = (logits * 2).round() / 2  # ties at the cut-off
        logp = logits.log_softmax(-1)
        logp[step % len(seeds), 250:] = -float("inf")  # a masked row
        want = [ras_sample(logp[k], solo_hist[k], solo_gens[k], params) for k in range(len(seeds))]
        got = ras_sample_rows(logp, batch_hist, batch_gens, params)
        assert got == want, step
        for k, token in enumerate(want):
            solo_hist[k].append(token)
            batch_hist[k].append(token)
    peaked = torch.full((len(seeds), 300), -9.0)
    peaked[:, 7] = 0.0  # the top-p head is 7 alone, and 7 fills every window: each row redraws
    peaked = peaked.log_softmax(-1)
    want = [ras_sample(peaked[k], [7] * 4, solo_gens[k], params) for k in range(len(seeds))]
    assert ras_sample_rows(peaked, [[7] * 4] * len(seeds), batch_gens, params) == want and 7 not in want
    assert [g.get_state().tolist() for g in solo_gens] == [g.get_state().tolist() for g in batch_gens]
    nan = torch.zeros(2, 10).log_softmax(-1)
    nan[0, 3] = float("nan")
    states = [g.get_state() for g in batch_gens[:2]]
    assert ras_sample_rows(nan, batch_hist[:2], batch_gens[:2], params) is None  # drawn row by row then
    assert all(torch.equal(g.get_state(), state) for g, state in zip(batch_gens[:2], states, strict=True))
    with pytest.raises(ValueError):
        ras_sample_rows(logp[0], [[]], [make_generator(0)], params)


def test_generator_for_seed_matches_global_seeding() -> None:
    probs = torch.rand(50)
    torch.manual_seed(1234)
    expected = [torch.multinomial(probs, 1, replacement=True).item() for _ in range(20)]
    g = make_generator(1234)
    assert [torch.multinomial(probs, 1, replacement=True, generator=g).item() for _ in range(20)] == expected


def test_ras_is_reproducible_and_independent_per_generator() -> None:
    logps = torch.randn(30, 300).log_softmax(-1)
    solo = []
    for seed in (3, 4):
        g, hist = make_generator(seed), []
        for row in logps:
            hist.append(ras_sample(row, hist, g))
        solo.append(hist)
    gens, hists = [make_generator(3), make_generator(4)], [[], []]
    for row in logps:  # interleaved, as in a batch
        for g, hist in zip(gens, hists, strict=True):
            hist.append(ras_sample(row, hist, g))
    assert hists == solo and solo[0] != solo[1]


def test_ras_redraws_a_repeated_token_from_the_full_distribution() -> None:
    logp = torch.full((10,), -8.0)
    logp[7] = 0.0
    logp = logp.log_softmax(0)
    params = RasParams(top_p=0.5, top_k=25, win_size=2, tau_r=0.5)
    g = make_generator(0)
    assert all(ras_sample(logp, [1, 2], g, params) == 7 for _ in range(20))
    assert all(ras_sample(logp, [7, 1], g, params) != 7 for _ in range(20))
    assert all(ras_sample(logp, [7, 1, 2], g, params) == 7 for _ in range(20))  # 7 left the window
    with pytest.raises(ValueError):
        ras_sample(logp.double(), [], g, params)


def test_silent_token_filter_drops_only_long_silent_runs() -> None:
    f = SilentTokenFilter()
    kept = [f.accept(t) for t in [1, 2, 28, 29, 55, 248, 494, 100, 1, 2]]
    assert kept == [True] * 5 + [False, False, True, True, True]
