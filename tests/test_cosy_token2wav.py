"""Behaviour of cosyvoice.token2wav (per-request streaming state) on a tiny random flow and vocoder."""

from __future__ import annotations

import pytest
import torch

from cosyvoice.flow import DiTConfig, Flow, FlowConfig
from cosyvoice.token2wav import SpeakerPrompt, Token2Wav, Token2WavError, Token2WavStream
from tests.test_cosy_hift import tiny_hift

SPF = 480  # samples per mel frame
VOCAB = 50


@pytest.fixture(scope="module")
def flow() -> Flow:
    dit = DiTConfig(dim=32, depth=1, heads=2, dim_head=16, ff_dim=32, conv_kernel=5, conv_groups=4)
    torch.manual_seed(3)
    model = Flow(FlowConfig(dit=dit, vocab_size=VOCAB, spk_embed_dim=12, pre_lookahead_channels=16)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def model(flow: Flow) -> Token2Wav:
    return Token2Wav(flow, tiny_hift())


@pytest.fixture(scope="module")
def full_model(flow: Flow) -> Token2Wav:
    return Token2Wav(flow, tiny_hift(), full_revocode=True)


def prompt(num_tokens: int, seed: int = 0) -> SpeakerPrompt:
    g = torch.Generator().manual_seed(seed)
    return SpeakerPrompt(
        prompt_token=torch.randint(0, VOCAB, (num_tokens,), generator=g),
        prompt_feat=torch.randn(2 * num_tokens, 80, generator=g),
        embedding=torch.randn(12, generator=g),
    )


def tokens(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def push_one_by_one(stream: Token2WavStream, values: list[int]) -> list[tuple[int, int]]:
    """(tokens known when the chunk came out, chunk length) for every chunk, the final one included."""
    events = []
    for i, t in enumerate(values):
        events += [(i + 1, c.shape[0]) for c in stream.push_tokens([t])]
    events += [(len(values), c.shape[0]) for c in stream.finish()]
    return events


def test_hops_follow_the_official_schedule(model: Token2Wav) -> None:
    stream = model.stream(prompt(73))  # pad = 75 - 73 = 2: hops 27, 50, 100
    events = push_one_by_one(stream, tokens(185))
    assert stream.hop_log == [
        (30, True, False, 0),
        (80, True, False, 27),
        (180, True, False, 77),
        (185, False, True, 177),
    ]
    # a hop fires as soon as hop + 3 look-ahead tokens are known; 8 mel frames stay withheld until the end
    assert events == [(30, SPF * (54 - 8)), (80, SPF * 100), (180, SPF * 200), (185, SPF * (16 + 8))]


@pytest.mark.parametrize(("num_prompt", "first_fire"), [(50, 28), (0, 28), (1, 52), (26, 52)])
def test_first_hop_is_padded_to_a_chunk_boundary(model: Token2Wav, num_prompt: int, first_fire: int) -> None:
    stream = model.stream(prompt(num_prompt))
    stream.add_tokens(tokens(first_fire - 1))
    assert not stream.next_hop_ready()
    assert stream.push_tokens([1]) != [] and stream.hop_log[0][0] == first_fire


def test_streamed_chunks_concatenate_to_the_vocoded_mel(full_model: Token2Wav) -> None:
    values = tokens(120, seed=2)
    stream = full_model.stream(prompt(40))
    chunks = stream.push_tokens(values) + stream.finish()
    assert len(chunks) > 2
    offline = full_model.offline(values, prompt(40))
    assert sum(c.shape[0] for c in chunks) == offline.shape[0] == SPF * 2 * len(values)
    # the streamed audio is exactly the offline vocoding of the mel the streamed flow calls produced
    assert stream.vocoder.mel is not None
    whole = full_model.hift(stream.vocoder.mel[None], finalize=True).speech[0]
    torch.testing.assert_close(torch.cat(chunks), whole, atol=1e-5, rtol=0)


def test_windowed_vocoder_equals_full_revocoding(model: Token2Wav, full_model: Token2Wav) -> None:
    values = tokens(200, seed=3)
    windowed, full = model.stream(prompt(30)), full_model.stream(prompt(30))
    a = windowed.push_tokens(values) + windowed.finish()
    b = full.push_tokens(values) + full.finish()
    assert [c.shape for c in a] == [c.shape for c in b] and len(a) == 4
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)
    assert windowed.vocoder.mel is not None and full.vocoder.mel is not None
    assert windowed.vocoder.mel.shape[1] < full.vocoder.mel.shape[1]  # bounded per-request mel


def test_concurrent_streams_keep_their_own_schedule(model: Token2Wav) -> None:
    va, vb = tokens(150, seed=4), tokens(90, seed=5)
    alone = []
    for p, v in ((prompt(73, seed=1), va), (prompt(50, seed=2), vb)):
        s = model.stream(p)
        alone.append((s.push_tokens(v) + s.finish(), s.hop_log))
    sa, sb = model.stream(prompt(73, seed=1)), model.stream(prompt(50, seed=2))
    got: list[list[torch.Tensor]] = [[], []]
    for i in range(150):
        got[0] += sa.push_tokens(va[i : i + 1])
        if i < 90:
            got[1] += sb.push_tokens(vb[i : i + 1])
    got[1] += sb.finish()
    got[0] += sa.finish()
    for (chunks, log), mine, stream in zip(alone, got, (sa, sb), strict=True):
        assert stream.hop_log == log
        assert len(mine) == len(chunks)
        for x, y in zip(mine, chunks, strict=True):
            torch.testing.assert_close(x, y, atol=1e-6, rtol=0)
    fresh = model.stream(prompt(50, seed=2))  # a later request starts again at hop 25 (no drift)
    fresh.push_tokens(tokens(28))
    assert fresh.hop_log == [(28, True, False, 0)]


def _ready_stream(model: Token2Wav, spec: tuple[SpeakerPrompt, list[int]]) -> Token2WavStream:
    stream = model.stream(spec[0])
    stream.add_tokens(spec[1])
    return stream


# Floating-point noise of batch-size-dependent kernels. A GEMM or SDPA over [2, T, D] is blocked
# differently from one over [1, T, D] (MKL, oneDNN and ATen pick kernels by shape and by CPU: AVX-512,
# AVX2, an AMD EPYC), so the flow's mel of a row differs by a few float32 ulps between a solo and a batched
# call even when nothing leaks (measured: 1.0e-6 .. 1.4e-6 at |mel| ~ 5, i.e. 2-3 ulps, under every
# ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS setting on an AVX-512 Xeon).
MEL_ULPS = 32
# The vocoder magnifies that noise: the NSF source rounds the running phase sum to float32 and multiplies
# it by 2 pi * 480, so one ulp of mel can move a sine by one ulp of the running sum, a step of ~1e-4 in
# the wave. Measured max |batched - solo| over this test's wave (peak ~0.49): 4.4e-5 (AVX-512), 6.1e-5
# (ATen AVX2), 1.1e-4 (MKL_ENABLE_INSTRUCTIONS=AVX2), 9.0e-5 (all libraries on AVX2, as on an AMD EPYC),
# 2.1e-6 (ATEN_CPU_CAPABILITY=default); a row duplicated in a batch of 2 with no padding at all differs
# from its solo run by the same amount in every setting. The wave tolerance is therefore that measured
# floor times WAVE_NOISE_FACTOR, but never below WAVE_REL_FLOOR of the peak (-60 dB, 4x the worst
# setting seen). A leak of padding into a real row changes it by orders of magnitude more (and the
# garbage-padding tests below check the no-leak property exactly, on identical shapes).
WAVE_NOISE_FACTOR = 8
WAVE_REL_FLOOR = 1e-3


def test_batched_run_equals_solo_runs(model: Token2Wav) -> None:
    specs = [(prompt(20, seed=6), tokens(70, seed=6)), (prompt(33, seed=7), tokens(45, seed=7))]
    solo_streams = [_ready_stream(model, spec) for spec in specs]
    solo = [model.run([s.next_job()])[0] for s in solo_streams]
    # Noise floor: each row run twice in one batch of 2 (same content, no padding) against its solo run.
    floor = 0.0
    for spec, want in zip(specs, solo, strict=True):
        pair = [_ready_stream(model, spec) for _ in range(2)]
        twice = model.run([s.next_job() for s in pair])
        floor = max(floor, *((got - want).abs().max().item() for got in twice))
    streams = [_ready_stream(model, spec) for spec in specs]  # different lengths: rows are padded
    batched = model.run([s.next_job() for s in streams])
    eps = torch.finfo(torch.float32).eps
    for got, want, stream, alone in zip(batched, solo, streams, solo_streams, strict=True):
        assert stream.vocoder.mel is not None and alone.vocoder.mel is not None
        mel_tol = MEL_ULPS * eps * alone.vocoder.mel.abs().max().item()
        torch.testing.assert_close(stream.vocoder.mel, alone.vocoder.mel, atol=mel_tol, rtol=0)
        wave_tol = max(WAVE_NOISE_FACTOR * floor, WAVE_REL_FLOOR * want.abs().max().item())
        torch.testing.assert_close(got, want, atol=wave_tol, rtol=0)


def _flow_rows(
    flow: Flow, specs: list[tuple[SpeakerPrompt, list[int]]], token_fill: int, feat_fill: float
) -> torch.Tensor:
    """One streaming flow call over right-padded rows whose padding holds the given garbage."""
    n, p = [len(v) for _, v in specs], [int(sp.prompt_token.shape[0]) for sp, _ in specs]
    f = [int(sp.prompt_feat.shape[0]) for sp, _ in specs]
    token = torch.full((len(specs), max(n)), token_fill, dtype=torch.int64)
    prompt_token = torch.full((len(specs), max(p)), token_fill, dtype=torch.int64)
    prompt_feat = torch.full((len(specs), max(f), 80), feat_fill)
    for b, (sp, v) in enumerate(specs):
        token[b, : n[b]] = torch.tensor(v)
        prompt_token[b, : p[b]] = sp.prompt_token
        prompt_feat[b, : f[b]] = sp.prompt_feat
    embedding = torch.stack([sp.embedding for sp, _ in specs])
    return flow.inference(
        token, n, prompt_token, p, prompt_feat, f, embedding, streaming=True, finalize=False
    )


@pytest.mark.parametrize(("token_fill", "feat_fill"), [(7, 1e6), (10**9, float("nan")), (-3, float("-inf"))])
def test_flow_padding_garbage_never_reaches_real_rows(flow: Flow, token_fill: int, feat_fill: float) -> None:
    specs = [(prompt(20, seed=6), tokens(70, seed=6)), (prompt(33, seed=7), tokens(45, seed=7))]
    clean = _flow_rows(flow, specs, 0, 0.0)
    dirty = _flow_rows(flow, specs, token_fill, feat_fill)
    # same shapes, same kernels: a real row must come out bit for bit the same whatever its padding holds
    assert torch.equal(dirty, clean)


@pytest.mark.parametrize("fill", [1e6, float("nan"), float("inf")])
def test_vocoder_padding_garbage_never_reaches_real_rows(model: Token2Wav, fill: float) -> None:
    mel = torch.randn(2, 80, 60, generator=torch.Generator().manual_seed(8))
    dirty = mel.clone()
    dirty[1, :, 40:] = fill
    lens, finals = [60, 40], [False, True]
    clean_out, dirty_out = model.hift(mel, lens, finals), model.hift(dirty, lens, finals)
    for b, n in enumerate(clean_out.speech_lens):
        assert torch.equal(dirty_out.speech[b, :n], clean_out.speech[b, :n])


def test_offline_mode_runs_nothing_before_finish(model: Token2Wav) -> None:
    stream = model.stream(prompt(10), stream=False)
    assert stream.push_tokens(tokens(80)) == []
    chunks = stream.finish()
    assert len(chunks) == 1 and chunks[0].shape[0] == SPF * 2 * 80
    assert stream.hop_log == [(80, False, True, 0)] and stream.finish() == []


def test_bad_use_raises_token2wav_error(model: Token2Wav) -> None:
    stream = model.stream(prompt(10))
    with pytest.raises(Token2WavError):
        stream.push_tokens([VOCAB])  # stop tokens never feed the flow
    with pytest.raises(Token2WavError):
        stream.push_tokens([1.5])  # type: ignore[list-item]
    stream.add_tokens(tokens(45))  # prompt 10: first hop 40 + 3 look-ahead
    job = stream.next_job()
    assert job is not None and not job.finalize
    stream.push_tokens([])  # runs that hop
    with pytest.raises(Token2WavError):
        model.run([job])  # stale plan
    stream.finish()
    with pytest.raises(Token2WavError):
        stream.push_tokens([1])
    with pytest.raises(Token2WavError):
        SpeakerPrompt(prompt_token=torch.zeros(3), prompt_feat=torch.zeros(6, 80), embedding=torch.zeros(12))
