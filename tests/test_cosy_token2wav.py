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
    model = Flow(FlowConfig(dit=dit, vocab_size=VOCAB, spk_embed_dim=12, lookahead_channels=16)).eval()
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


def test_batched_run_equals_solo_runs(model: Token2Wav) -> None:
    specs = [(prompt(20, seed=6), tokens(70, seed=6)), (prompt(33, seed=7), tokens(45, seed=7))]
    solo = []
    for p, v in specs:
        s = model.stream(p)
        s.add_tokens(v)
        solo.append(model.run([s.next_job()]))
    streams = [model.stream(p) for p, _ in specs]
    for s, (_, v) in zip(streams, specs, strict=True):
        s.add_tokens(v)
    batched = model.run([s.next_job() for s in streams])
    for got, want in zip(batched, solo, strict=True):
        torch.testing.assert_close(got, want[0], atol=1e-5, rtol=0)


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
