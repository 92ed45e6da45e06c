"""Behaviour of cosyvoice.hift on a tiny random vocoder (release kernels and rates, few channels)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cosyvoice.checkpoint import CheckpointError, load_module_state
from cosyvoice.hift import (
    CausalHift,
    HiFTConfig,
    HiftInputError,
    HiftNoiseBuffers,
    HiftStreamState,
    fold_hift_state,
    hift_buffers_from_rng_state,
    official_hift_rng_state,
    vocode_streams,
)
from cosyvoice.hift.stft import SpectralCodec

SPF = 480  # samples per mel frame
NOISE_SECONDS = 20


def tiny_config() -> HiFTConfig:
    return HiFTConfig(
        in_channels=80,
        base_channels=16,
        nb_harmonics=8,
        sampling_rate=24000,
        nsf_alpha=0.1,
        nsf_sigma=0.003,
        nsf_voiced_threshold=10.0,
        upsample_rates=(8, 5, 3),
        upsample_kernel_sizes=(16, 11, 7),
        istft_n_fft=16,
        istft_hop_len=4,
        resblock_kernel_sizes=(3, 7, 11),
        resblock_dilation_sizes=((1, 3, 5),) * 3,
        source_resblock_kernel_sizes=(7, 7, 11),
        source_resblock_dilation_sizes=((1, 3, 5),) * 3,
        lrelu_slope=0.1,
        audio_limit=0.99,
        conv_pre_look_right=4,
        f0_num_class=1,
        f0_in_channels=80,
        f0_cond_channels=8,
    )


def tiny_hift(
    seed: int = 0, config: HiFTConfig | None = None, noise_seconds: int = NOISE_SECONDS
) -> CausalHift:
    """Random weights scaled so f0 is mostly voiced and magnitudes stay below the iSTFT clip."""
    g = torch.Generator().manual_seed(seed)
    buffers = HiftNoiseBuffers(
        rand_ini=torch.cat([torch.zeros(1, 1), torch.rand(1, 8, generator=g)], dim=1),
        sine_noise=torch.rand(1, noise_seconds * 24000, 9, generator=g),
        uv_noise=None,
    )
    model = CausalHift(tiny_config() if config is None else config, buffers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif p.dim() > 1:
                fan_in = p.shape[1] * (p.shape[2] if p.dim() == 3 else 1)
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) / math.sqrt(fan_in))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        model.f0_predictor.classifier.bias.fill_(150.0)
        model.conv_post.weight.mul_(0.1)
    return model.eval()


@pytest.fixture(scope="module")
def hift() -> CausalHift:
    return tiny_hift()


def random_mel(frames: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 80, frames, generator=g)  # [B, 80, T]


def test_nonfinal_call_withholds_eight_frames_and_matches_final_prefix(hift: CausalHift) -> None:
    mel = random_mel(60)
    full = hift(mel, finalize=True)
    assert full.speech.shape == (1, 60 * SPF) and full.source.shape == (1, 1, 60 * SPF)
    part = hift(mel[:, :, :40], finalize=False)
    assert part.speech.shape == (1, (40 - 8) * SPF)
    assert part.source.shape == (1, 1, (40 - 3) * SPF)  # f0 uses 3 frames of look-ahead
    torch.testing.assert_close(part.speech, full.speech[:, : part.speech.shape[1]], atol=1e-5, rtol=0)
    torch.testing.assert_close(part.source, full.source[:, :, : part.source.shape[2]], atol=1e-6, rtol=0)
    assert full.speech.abs().max() <= 0.99 and full.speech.abs().max() > 1e-3


@pytest.mark.parametrize("context", [None, "receptive"])
def test_streamed_prefixes_concatenate_to_offline(hift: CausalHift, context: str | None) -> None:
    mel = random_mel(150, seed=2)
    offline = hift(mel, finalize=True).speech[0]
    ctx = None if context is None else hift.left_context_frames()
    state = HiftStreamState(hift, context_frames=ctx)
    chunks, done = [], 0
    for i, end in enumerate([56, 106, 120, 150]):
        chunk = state.push(hift, mel[0, :, done:end], finalize=i == 3)
        done = end
        chunks.append(chunk)
    assert [c.shape[0] for c in chunks] == [48 * SPF, 50 * SPF, 14 * SPF, 38 * SPF]
    torch.testing.assert_close(torch.cat(chunks), offline, atol=1e-5, rtol=0)
    if ctx is not None:  # the window keeps only the mel it still needs
        assert state.mel is not None and state.mel.shape[1] <= ctx + 8 + 30


def test_window_shorter_than_receptive_field_is_refused(hift: CausalHift) -> None:
    with pytest.raises(HiftInputError):
        HiftStreamState(hift, context_frames=hift.left_context_frames() - 1)


def test_batch_rows_equal_solo_runs(hift: CausalHift) -> None:
    lens, finals = [70, 45, 58], [True, False, True]
    mel = random_mel(70, seed=3, batch=3)
    batch = hift(mel, lens, finals)
    for b, (n, final) in enumerate(zip(lens, finals, strict=True)):
        solo = hift(mel[b : b + 1, :, :n], finalize=final)
        assert batch.speech_lens[b] == solo.speech.shape[1] == SPF * (n if final else n - 8)
        # batch size changes the conv kernels' summation order: float noise only
        torch.testing.assert_close(batch.speech[b, : batch.speech_lens[b]], solo.speech[0], atol=1e-5, rtol=0)
        got_source = batch.source[b, :, : batch.source_lens[b]]
        assert torch.equal(got_source, solo.source[0])


def test_batched_stream_states_equal_solo_states(hift: CausalHift) -> None:
    mel_a, mel_b = random_mel(120, seed=4)[0], random_mel(90, seed=5)[0]
    ctx = hift.left_context_frames()
    solo = []
    for mel in (mel_a, mel_b):
        state = HiftStreamState(hift, context_frames=ctx)
        solo.append(
            [state.push(hift, mel[:, :60], finalize=False), state.push(hift, mel[:, 60:], finalize=True)]
        )
    states = [HiftStreamState(hift, context_frames=ctx) for _ in range(2)]
    for state, mel in zip(states, (mel_a, mel_b), strict=True):
        state.append(mel[:, :60])
    first = vocode_streams(hift, states, [False, False])
    for state, mel in zip(states, (mel_a, mel_b), strict=True):
        state.append(mel[:, 60:])
    second = vocode_streams(hift, states, [True, True])
    for b in range(2):
        torch.testing.assert_close(first[b], solo[b][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(second[b], solo[b][1], atol=1e-5, rtol=0)


def upstream_source(hift: CausalHift, f0: torch.Tensor) -> torch.Tensor:
    """The official sample-level SineGen2 graph (docs/cosyvoice.md §6), written independently."""
    src = hift.m_source
    f0_up = F.interpolate(f0[:, None], scale_factor=SPF, mode="nearest").transpose(1, 2)  # [B, L, 1]
    fn = f0_up * torch.arange(1, 10, dtype=torch.float32)[None, None]  # [B, L, 9]
    rad = (fn / 24000) % 1
    rad[:, 0, :] = rad[:, 0, :] + src.rand_ini
    rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / SPF, mode="linear").transpose(1, 2)
    phase = torch.cumsum(rad, dim=1) * 2 * math.pi  # [B, T, 9] float32 running sum
    phase = F.interpolate(phase.transpose(1, 2) * SPF, scale_factor=SPF, mode="nearest").transpose(1, 2)
    sines = torch.sin(phase) * 0.1
    uv = (f0_up > 10).float()
    noise = (uv * 0.003 + (1 - uv) * 0.1 / 3) * src.sine_noise[None, : sines.shape[1]]
    return torch.tanh(src.l_linear(sines * uv + noise)).transpose(1, 2)  # [B, 1, L]


def test_source_is_bit_identical_to_the_sample_level_graph(hift: CausalHift) -> None:
    g = torch.Generator().manual_seed(6)
    f0 = torch.rand(2, 300, generator=g) * 300  # [B, T] a mix of voiced and unvoiced frames
    f0[:, 100:120] = 0.0
    ours, _ = hift.m_source(f0)
    assert torch.equal(ours, upstream_source(hift, f0))


def test_f0_predictor_and_source_keep_their_dtypes_when_cast(hift: CausalHift) -> None:
    model = tiny_hift(seed=7).to(torch.bfloat16)
    assert model.conv_pre.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float64 for p in model.f0_predictor.parameters())
    assert model.m_source.sine_noise.dtype == torch.float32 and model.spectral.window.dtype == torch.float32
    out = model(random_mel(20).to(torch.bfloat16))
    assert out.speech.dtype == torch.float32 and bool(torch.isfinite(out.speech).all())


def test_istft_matches_torch_and_handles_per_row_lengths() -> None:
    codec = SpectralCodec(16, 4)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 400, generator=g)
    spec = codec.stft(x)  # [B, 18, 101]
    ref = torch.stft(x, 16, 4, 16, window=codec.window, center=True, return_complex=True)
    torch.testing.assert_close(spec, torch.cat([ref.real, ref.imag], dim=1))
    mag, phase = ref.abs(), ref.angle()
    torch.testing.assert_close(codec.istft(mag, phase), torch.istft(ref, 16, 4, 16, window=codec.window))
    torch.testing.assert_close(codec.istft(mag, phase), x, atol=1e-5, rtol=0)  # perfect reconstruction
    short = codec.stft(x, lengths=[400, 240])
    torch.testing.assert_close(short[1, :, :61], codec.stft(x[1:, :240])[0])
    complex_short = torch.complex(short[:, :9], short[:, 9:])  # [B, 9, F]
    rows = codec.istft(complex_short.abs(), complex_short.angle(), num_frames=[101, 61])
    torch.testing.assert_close(rows[1, :240], x[1, :240], atol=1e-5, rtol=0)


def weight_normed_names(model: CausalHift) -> list[str]:
    """Modules the official checkpoint stores with weight norm (docs/cosyvoice.md §1.1)."""
    names = ["conv_pre", "conv_post", *[f"ups.{i}" for i in range(len(model.ups))]]
    names += [f"f0_predictor.condnet.{i}" for i in (0, 2, 4, 6, 8)]
    for group in ("resblocks", "source_resblocks"):
        for i, block in enumerate(getattr(model, group)):
            for j in range(len(block.convs1)):
                names += [f"{group}.{i}.convs1.{j}", f"{group}.{i}.convs2.{j}"]
    return names


def official_layout(model: CausalHift, style: str) -> dict[str, torch.Tensor]:
    """Unfold our weights into the release key layout: g = ||v|| per output channel, v = weight."""
    state = {k: v.float() for k, v in model.state_dict().items()}
    keys = ("parametrizations.weight.original0", "parametrizations.weight.original1")
    keys = keys if style == "new" else ("weight_g", "weight_v")
    for name in weight_normed_names(model):
        v = state.pop(f"{name}.weight")
        state[f"{name}.{keys[0]}"] = v.norm(dim=(1, 2), keepdim=True)  # [out, 1, 1]
        state[f"{name}.{keys[1]}"] = v
    return {f"generator.{k}": v for k, v in state.items()}


@pytest.mark.parametrize("style", ["new", "old"])
def test_loading_folds_weight_norm_of_either_key_style(hift: CausalHift, style: str) -> None:
    official = official_layout(hift, style)
    g_key = "parametrizations.weight.original0" if style == "new" else "weight_g"
    g = official[f"generator.conv_pre.{g_key}"] * torch.linspace(0.5, 1.5, 16)[:, None, None]  # [16, 1, 1]
    official[f"generator.conv_pre.{g_key}"] = g
    folded = fold_hift_state(official, "hift.pt")
    assert folded["f0_predictor.condnet.0.weight"].dtype == torch.float64
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(80, 16, 5))  # torch's own parametrization
    with torch.no_grad():
        conv.parametrizations.weight.original0.copy_(g)
        conv.parametrizations.weight.original1.copy_(hift.conv_pre.weight)
    assert torch.equal(folded["conv_pre.weight"], conv.weight)
    folded["conv_pre.weight"] = hift.conv_pre.weight.detach().clone()
    model = tiny_hift(seed=0)  # same noise buffers as the fixture; weights wiped before loading
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    load_module_state(model, folded, "hift.pt")
    mel = random_mel(30)
    torch.testing.assert_close(model(mel).speech, hift(mel).speech, atol=1e-5, rtol=0)
    del official["generator.conv_post.bias"]
    with pytest.raises(CheckpointError, match="conv_post.bias"):
        load_module_state(model, fold_hift_state(official, "hift.pt"), "hift.pt")


def test_rng_replay_matches_real_module_construction_and_keeps_global_rng() -> None:
    vocab, cond = 100, 8
    before = torch.get_rng_state()
    replayed = official_hift_rng_state(
        flow_vocab_size=vocab, flow_mel_dim=80, spk_embed_dim=192, f0_in_channels=80, f0_cond_channels=cond
    )
    assert torch.equal(torch.get_rng_state(), before)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.randn(1, 80, 15000)
        nn.Embedding(vocab, 80)
        nn.Linear(192, 80)
        nn.Conv1d(80, cond, 4)
        for _ in range(4):
            nn.Conv1d(cond, cond, 3)
        nn.Linear(cond, 1)
        real = torch.get_rng_state()
        rand_ini = torch.rand(1, 9)
        sine = torch.rand(1, 5000, 9)
    assert torch.equal(replayed, real)
    buffers = hift_buffers_from_rng_state(replayed, num_samples=2000)
    assert torch.equal(buffers.rand_ini[:, 1:], rand_ini[:, 1:]) and buffers.rand_ini[0, 0] == 0
    assert torch.equal(buffers.sine_noise, sine[:, :2000])  # a shorter buffer is an exact prefix


def test_bad_inputs_raise_hift_input_error(hift: CausalHift) -> None:
    with pytest.raises(HiftInputError):
        hift(torch.randn(1, 40, 20))
    with pytest.raises(HiftInputError):
        hift(random_mel(7), finalize=False)  # needs 8 frames of look-ahead
    with pytest.raises(HiftInputError):
        hift(random_mel(20, batch=2), [20, 30])
    with pytest.raises(HiftInputError):
        hift(random_mel(NOISE_SECONDS * 50 + 1))  # longer than the noise buffer


def test_a_vocoder_run_a_piece_at_a_time_gives_the_same_samples_bit_for_bit(hift: CausalHift) -> None:
    """``CausalHift.pieces`` (the engine's ``vocoder_pieces``): the same operations as a call, so the same
    samples however long the caller waits between pieces and whatever runs between them; and a stream
    state's ``vocode_pieces`` equals ``append`` + ``vocode_streams``, leaving the state as it was until
    its last piece."""
    mel = random_mel(130, seed=11)
    whole = hift(mel, finalize=False)
    pieces = hift.pieces(mel, finalize=False)
    count = 0
    while True:
        try:
            next(pieces)
        except StopIteration as end:
            sliced = end.value
            break
        count += 1
        hift(random_mel(40, seed=count), finalize=True)  # other work between two pieces
    assert count >= len(hift.ups) * hift.num_kernels  # a piece a resblock at least
    assert torch.equal(sliced.speech, whole.speech) and sliced.speech_lens == whole.speech_lens
    assert torch.equal(sliced.phase_running, whole.phase_running)
    ctx = hift.left_context_frames()
    called, stepped = HiftStreamState(hift, context_frames=ctx), HiftStreamState(hift, context_frames=ctx)
    for start, stop, final in ((0, 60, False), (60, 110, False), (110, 130, True)):
        chunk = mel[0, :, start:stop]
        expected = called.push(hift, chunk, finalize=final)
        offset = stepped.speech_offset
        dropped = stepped.vocode_pieces(hift, chunk, finalize=final)
        next(dropped)  # begun and dropped: the state is untouched
        dropped.close()
        assert stepped.speech_offset == offset and stepped.total_frames == start
        run = stepped.vocode_pieces(hift, chunk, finalize=final)
        while True:
            try:
                next(run)
            except StopIteration as end:
                got = end.value
                break
        assert torch.equal(got, expected)
        assert stepped.speech_offset == called.speech_offset and stepped.total_frames == stop
    assert stepped.finished
    with pytest.raises(HiftInputError, match="after the final"):
        next(stepped.vocode_pieces(hift, mel[0, :, :10], finalize=True))
