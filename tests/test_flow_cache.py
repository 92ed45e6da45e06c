"""The flow chunk caches (cosyvoice/flow/chunk_cache.py): cached hops equal a full recompute.

Tolerances: on this CPU the cached and recomputed fp32 mels differ by at most ~1e-6 (different GEMM
row counts and key order in the attention sums); the issue's bound is 1e-5.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cosyvoice.flow import DiTConfig, Flow, FlowConfig, FlowInputError
from cosyvoice.flow.chunk_cache import FlowCacheManager, FlowRowCache, segment_bytes
from cosyvoice.flow.incremental import row_groups
from tests.test_cosy_flow import VOCAB, single_thread, tiny_config  # noqa: F401 - single_thread: autouse

ATOL = 1e-5
LOOKAHEAD = 3


def _randomise(model: Flow, seed: int, scale: float = 0.05) -> Flow:
    torch.manual_seed(seed)
    with torch.no_grad():  # non-zero AdaLN so every block really contributes
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def flow() -> Flow:
    return _randomise(Flow(tiny_config()), 1234)


class Voice:
    """A prompt (tokens, mel, x-vector) and a token list to speak, as batch-1 tensors."""

    def __init__(
        self, seed: int, num_prompt: int, num_tokens: int, vocab: int = VOCAB, spk: int = 12
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.prompt_token = torch.randint(0, vocab, (1, num_prompt), generator=g, dtype=torch.int32)
        self.prompt_feat = torch.randn(1, 2 * num_prompt, 80, generator=g)
        self.embedding = torch.randn(1, spk, generator=g)
        self.tokens = torch.randint(0, vocab, (1, num_tokens), generator=g, dtype=torch.int32)

    @property
    def num_prompt(self) -> int:
        return self.prompt_token.shape[1]


def hops(num_prompt: int, num_tokens: int, first: int, max_hop: int) -> list[tuple[int, int]]:
    """(tokens passed, token offset) of the streaming hops over ``num_tokens`` tokens."""
    pad = math.ceil(num_prompt / first) * first - num_prompt
    out, offset, hop = [], 0, first
    while True:
        this = hop + (pad if offset == 0 else 0)
        if offset + this + LOOKAHEAD > num_tokens:
            return out
        out.append((offset + this + LOOKAHEAD, offset))
        offset += this
        hop = min(max_hop, 2 * hop)


def call(
    flow: Flow, voice: Voice, n: int, cache: FlowRowCache | None = None, offset: int = 0, **kw
) -> torch.Tensor:
    """Mel [1, 80, m] from output frame 2 * offset (the frames a hop emits)."""
    extra = {} if cache is None else {"caches": [cache], "skip_frames": [2 * offset]}
    mel = flow.inference(
        voice.tokens[:, :n], [n], voice.prompt_token, [voice.num_prompt], voice.prompt_feat,
        [2 * voice.num_prompt], voice.embedding, **kw, **extra,
    )  # fmt: skip
    return mel[:, :, 2 * offset :]


@pytest.mark.parametrize("num_prompt", [3, 13, 16, 21])
def test_cached_hops_equal_full_recompute_at_every_hop(flow: Flow, num_prompt: int) -> None:
    voice = Voice(num_prompt, num_prompt, 70)
    manager = FlowCacheManager(1 << 30)
    owner = object()  # stands for the voice's prompt object
    for stream in range(2):  # the second stream of the voice starts from the shared prompt prefix
        cache = manager.stream_cache(owner)
        plan = hops(num_prompt, 70, first=4, max_hop=16)
        assert len(plan) >= 3
        for n, offset in plan:
            full = call(flow, voice, n, None, offset, streaming=True, finalize=False)
            cached = call(flow, voice, n, cache, offset, streaming=True, finalize=False)
            torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)
            assert cache.frames == 2 * (num_prompt + n - LOOKAHEAD)  # every complete chunk kept
        last = plan[-1][0] - LOOKAHEAD  # token offset after the last hop
        for streaming in (False, True):  # closing call: exact (full attention) or final_pass streaming
            full = call(flow, voice, 70, streaming=streaming, finalize=True)[:, :, 2 * last :]
            cached = call(flow, voice, 70, cache, last, streaming=streaming, finalize=True)
            torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)
        voice_chunks = max(0, (num_prompt - LOOKAHEAD) * 2 // 8)
        assert manager.counts["voice_hits"] == (stream if voice_chunks else 0)
        cache.release()
    assert manager.stream_bytes == 0
    expected = segment_bytes(flow.cfg.dit, voice_chunks * 8, n_timesteps=10, copies=2, element_size=4)
    assert manager.voice_bytes == (expected if voice_chunks else 0)


def test_hop_computes_only_new_frames(flow: Flow) -> None:
    """A cached hop runs the estimator over its new chunks only (the work the cache saves)."""
    voice = Voice(3, 21, 40)
    manager = FlowCacheManager(1 << 30)
    owner = object()
    first = manager.stream_cache(owner)
    n, _ = hops(21, 40, first=4, max_hop=16)[0]
    call(flow, voice, n, first, streaming=True, finalize=False)  # registers the voice's 4 prompt chunks
    widths: list[int] = []
    handle = flow.decoder.estimator.input_proj.register_forward_hook(
        lambda _m, args, _o: widths.append(args[0].shape[1])
    )
    try:
        call(flow, voice, n, manager.stream_cache(owner), streaming=True, finalize=False)
    finally:
        handle.remove()
    # voice-only chunks end at (21 - 3) * 2 // 8 * 8 = 32; the hop's frames end at 2 * (21 + 7) = 56
    assert widths and set(widths) == {56 - 32}


def test_batched_rows_of_two_voices_and_an_uncached_row_equal_their_solo_runs(flow: Flow) -> None:
    a, b, c = Voice(1, 13, 60), Voice(2, 21, 60), Voice(3, 9, 60)
    manager = FlowCacheManager(1 << 30)
    owner_a, owner_b = object(), object()
    # Voice a's prefix is registered; b's stream is past its first hop; c has no cache at all.
    warm_a = manager.stream_cache(owner_a)
    call(flow, a, hops(13, 60, 4, 16)[0][0], warm_a, streaming=True, finalize=False)
    cache_a, cache_b = manager.stream_cache(owner_a), manager.stream_cache(owner_b)
    (na, oa), (nb0, _), (nb, ob), (nc, oc) = (
        hops(13, 60, 4, 16)[0],
        *hops(21, 60, 4, 16)[:2],
        hops(9, 60, 4, 16)[1],
    )
    call(flow, b, nb0, cache_b, streaming=True, finalize=False)
    rows = [(a, na, oa, cache_a), (b, nb, ob, cache_b), (c, nc, oc, None)]
    p_max, n_max = max(v.num_prompt for v, *_ in rows), max(n for _, n, *_ in rows)
    token = torch.zeros(3, n_max, dtype=torch.int32)
    prompt_token = torch.zeros(3, p_max, dtype=torch.int32)
    prompt_feat = torch.zeros(3, 2 * p_max, 80)
    for i, (v, n, _, _) in enumerate(rows):
        token[i, :n] = v.tokens[0, :n]
        prompt_token[i, : v.num_prompt] = v.prompt_token[0]
        prompt_feat[i, : 2 * v.num_prompt] = v.prompt_feat[0]
    embedding = torch.cat([v.embedding for v, *_ in rows])
    p_lens = [v.num_prompt for v, *_ in rows]
    batched = flow.inference(
        token, [n for _, n, *_ in rows], prompt_token, p_lens, prompt_feat, [2 * p for p in p_lens], embedding,
        streaming=True, finalize=False, caches=[r[3] for r in rows], skip_frames=[2 * o for *_, o, _ in rows],
    )  # fmt: skip
    assert manager.counts["voice_hits"] == 1
    lens = flow.mel_lengths([n for _, n, *_ in rows], p_lens, [2 * p for p in p_lens], False)
    for i, (v, n, offset, _) in enumerate(rows):
        solo = call(flow, v, n, None, offset, streaming=True, finalize=False)
        torch.testing.assert_close(batched[i : i + 1, :, 2 * offset : lens[i]], solo, atol=ATOL, rtol=0)


def test_a_short_budget_evicts_voices_first_and_then_recomputes(flow: Flow) -> None:
    voice = Voice(5, 13, 60)
    prefix = segment_bytes(flow.cfg.dit, 16, n_timesteps=10, copies=2, element_size=4)  # 2 chunks
    manager = FlowCacheManager(prefix + prefix // 2)  # room for one voice prefix and one chunk more
    old = manager.stream_cache(owner_old := object())
    call(flow, voice, hops(13, 60, 4, 16)[0][0], old, streaming=True, finalize=False)
    old.release()
    assert manager.voice_bytes == prefix  # (13 - 3) * 2 // 8 = 2 voice-only chunks, 16 frames
    cache = manager.stream_cache(object())  # another voice: needs the room, evicts the first
    for n, offset in hops(13, 60, 4, 16):
        full = call(flow, voice, n, None, offset, streaming=True, finalize=False)
        cached = call(flow, voice, n, cache, offset, streaming=True, finalize=False)
        torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)
        assert manager.used_bytes <= manager.limit_bytes
    assert manager.counts["voice_evictions"] == 1 and not manager.has_voice(owner_old)
    assert manager.counts["stream_refusals"] >= 1
    cache.release()
    assert manager.used_bytes == manager.voice_bytes


def test_changed_solver_settings_never_reuse_chunks(flow: Flow) -> None:
    voice = Voice(6, 13, 40)
    manager = FlowCacheManager(1 << 30)
    owner = object()
    n, _ = hops(13, 40, 4, 16)[0]
    call(flow, voice, n, manager.stream_cache(owner), streaming=True, finalize=False)
    for kw in ({"n_timesteps": 4}, {"cfg_rate": 0.0}, {"temperature": 0.5}):
        full = call(flow, voice, n, streaming=True, finalize=False, **kw)
        cached = call(flow, voice, n, manager.stream_cache(owner), streaming=True, finalize=False, **kw)
        torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)


def test_full_size_architecture_one_hop_cached_equals_recompute() -> None:
    """Release DiT sizes (dim 1024, 22 blocks, 16 heads, chunk 50), default random init.

    One Euler step keeps it quick: the cache logic is the same for every step (the tiny tests use 10).
    """
    dit = DiTConfig(dim=1024, depth=22, heads=16, dim_head=64, ff_dim=2048, static_chunk_size=50)
    torch.manual_seed(7)
    flow = Flow(FlowConfig(dit=dit, vocab_size=6561, n_timesteps=1)).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        voice = Voice(11, 60, 50, vocab=6561, spk=192)  # 60 prompt tokens: chunks 0-1 voice-only
        manager = FlowCacheManager(1 << 32)
        owner = object()
        n, _ = hops(60, 50, first=25, max_hop=100)[0]  # 40 tokens + 3 look-ahead: frames 0 .. 200
        full = call(flow, voice, n, streaming=True, finalize=False)
        capturing = call(flow, voice, n, manager.stream_cache(owner), streaming=True, finalize=False)
        torch.testing.assert_close(capturing, full, atol=ATOL, rtol=0)
        assert manager.voice_bytes == segment_bytes(dit, 100, n_timesteps=1, copies=2, element_size=4)
        cached = call(flow, voice, n, manager.stream_cache(owner), streaming=True, finalize=False)
        assert manager.counts["voice_hits"] == 1
        torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)
    finally:
        torch.set_num_threads(threads)


PARITY = Path(__file__).resolve().parents[1].parent / "shared" / "cosyvoice-parity" / "v3-tiny"


@pytest.mark.skipif(not (PARITY / "cases.json").is_file(), reason="no v3-tiny parity fixtures")
def test_parity_token2wav_cases_pass_with_the_flow_cache_on() -> None:
    """The official streaming outputs, reproduced with every hop served from the chunk cache."""
    from cosyvoice.token2wav import SpeakerPrompt, Token2Wav
    from scripts.parity_cases import ParityContext
    from scripts.parity_cases.hift import hift_model

    spec = json.loads((PARITY / "cases.json").read_text(encoding="utf-8"))
    inputs, expected = (
        load_file(str(PARITY / "inputs.safetensors")),
        load_file(str(PARITY / "expected.safetensors")),
    )
    ctx = ParityContext(model_dir=PARITY / "model", fixture_dir=PARITY)
    manager = FlowCacheManager(1 << 30)
    model = Token2Wav(Flow.from_pretrained(ctx.model_dir), hift_model(ctx), flow_cache=manager)
    cases = [c for c in spec["cases"] if c["kind"] == "token2wav" and c["params"]["stream"]]
    assert cases
    for case in cases:
        x = {k: inputs[f"{case['name']}.{k}"] for k in case["inputs"]}
        prompt = SpeakerPrompt(
            prompt_token=x["prompt_token"][0], prompt_feat=x["prompt_feat"][0], embedding=x["embedding"][0]
        )
        for _ in range(2):  # the second run starts from the voice's cached prompt chunks
            stream = model.stream(prompt)
            chunks = stream.push_tokens(x["token"][0]) + stream.finish()
            for i, chunk in enumerate(chunks):
                spec_i = case["outputs"][f"speech.{i}"]
                ref = expected[f"{case['name']}.speech.{i}"][0]
                assert chunk.shape == ref.shape
                assert (
                    (chunk.double() - ref.double()).abs()
                    <= spec_i["atol"] + spec_i["rtol"] * ref.double().abs()
                ).all()
    assert manager.counts["voice_hits"] >= 1 and manager.stream_bytes == 0


def test_rows_of_very_different_lengths_are_solved_in_separate_calls() -> None:
    # cached hops of ~100 new frames beside closing full passes of ~500: never padded to 500
    groups = row_groups([100, 500, 96, 480, 100], [350, 0, 350, 0, 400])
    assert sorted(groups) == [[0, 2, 4], [1, 3]]
    assert row_groups([100, 90, 100], [0, 0, 0]) == [[0, 1, 2]]  # alike: one call
    assert row_groups([500], [0]) == [[0]]


def _begin(flow: Flow, voice: Voice, n: int, cache: FlowRowCache, offset: int):
    return flow.begin_inference(
        voice.tokens[:, :n], [n], voice.prompt_token, [voice.num_prompt], voice.prompt_feat,
        [2 * voice.num_prompt], voice.embedding, streaming=True, finalize=False, caches=[cache],
        skip_frames=[2 * offset],
    )  # fmt: skip


def test_a_cached_solve_in_slices_is_one_call_bit_for_bit_an_euler_step_an_advance(flow: Flow) -> None:
    """``begin_inference`` with caches, advanced one Euler step at a time (the engine runs other streams'
    work between two), gives the mel of one ``inference`` call bit for bit and keeps the same chunks."""
    voice = Voice(7, 13, 60)
    whole_cache, sliced_cache = (FlowCacheManager(1 << 30).stream_cache(object()) for _ in range(2))
    steps = flow.cfg.n_timesteps
    plan = hops(13, 60, first=4, max_hop=16)
    assert len(plan) >= 3
    for n, offset in plan:
        whole = call(flow, voice, n, whole_cache, offset, streaming=True, finalize=False)
        solve = _begin(flow, voice, n, sliced_cache, offset)
        with pytest.raises(FlowInputError):
            flow.finish_inference(solve)  # nothing integrated yet
        for _ in range(steps - 1):
            assert not flow.advance_inference(solve, 1) and not solve.done
        assert flow.advance_inference(solve, 1) and solve.done
        assert flow.advance_inference(solve, 1)  # done stays done
        assert torch.equal(flow.finish_inference(solve)[:, :, 2 * offset :], whole)
        assert sliced_cache.frames == whole_cache.frames == 2 * (13 + n - LOOKAHEAD)


def test_a_sliced_batch_of_two_solve_calls_takes_an_advance_per_euler_step_of_each(flow: Flow) -> None:
    """A batch whose rows are solved in two calls (a cached hop, an exact closing pass): twice the Euler
    steps, each one advance; the same mel as one call."""
    voice = Voice(8, 13, 60)
    (n0, _), (n1, offset) = hops(13, 60, first=4, max_hop=16)[:2]
    mels, counts = [], []
    for sliced in (False, True):
        cache = FlowCacheManager(1 << 30).stream_cache(object())
        call(flow, voice, n0, cache, streaming=True, finalize=False)  # the first hop: its chunks are kept
        hop_row = torch.cat((voice.tokens[:, :n1], torch.zeros(1, 60 - n1, dtype=torch.int32)), dim=1)
        args = (
            torch.cat((hop_row, voice.tokens)), [n1, 60], voice.prompt_token.repeat(2, 1), [13, 13], voice.prompt_feat.repeat(2, 1, 1), [26, 26],
            voice.embedding.repeat(2, 1),
        )
        kw = {"streaming": [True, False], "finalize": [False, True], "caches": [cache, None],
              "skip_frames": [2 * offset, 0]}  # fmt: skip
        if not sliced:
            mels.append(flow.inference(*args, **kw))
            continue
        solve = flow.begin_inference(*args, **kw)
        count = 0
        while not flow.advance_inference(solve, 1):
            count += 1
        counts.append(count + 1)
        mels.append(flow.finish_inference(solve))
    assert counts == [2 * flow.cfg.n_timesteps]
    assert torch.equal(mels[0], mels[1])
