"""Behaviour of cosyvoice.flow on tiny random modules (no checkpoint or fixture needed)."""

from __future__ import annotations

import pytest
import torch

from cosyvoice.flow import (
    DiTConfig,
    Flow,
    FlowCheckpointError,
    FlowConfig,
    FlowInputError,
    attention_mask,
    chunk_mask,
    euler_schedule,
    fixed_noise,
)
from cosyvoice.flow.dit import Attention, rotary_tables

CHUNK = 8  # frames per streaming chunk in the tiny model (4 tokens)
VOCAB = 40


def tiny_config(**dit_overrides) -> FlowConfig:
    dit = DiTConfig(
        dim=32,
        depth=2,
        heads=2,
        dim_head=16,
        ff_dim=64,
        mel_dim=80,
        mu_dim=80,
        spk_dim=80,
        conv_kernel=5,
        conv_groups=4,
        static_chunk_size=CHUNK,
        **dit_overrides,
    )
    return FlowConfig(dit=dit, vocab_size=VOCAB, spk_embed_dim=12, pre_lookahead_channels=16)


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """The models here are tiny: one thread avoids OpenMP spin-waits on a busy shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def flow() -> Flow:
    torch.manual_seed(1234)
    model = Flow(tiny_config()).eval()
    with torch.no_grad():  # non-zero AdaLN so every block really contributes
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def random_inputs(rows: list[tuple[int, int]], seed: int = 0):
    """rows: (n_tokens, n_prompt_tokens) per row -> right-padded batch tensors."""
    g = torch.Generator().manual_seed(seed)
    n_max, p_max = max(r[0] for r in rows), max(r[1] for r in rows)
    batch = len(rows)
    return {
        "token": torch.randint(0, VOCAB, (batch, n_max), generator=g, dtype=torch.int32),
        "prompt_token": torch.randint(0, VOCAB, (batch, p_max), generator=g, dtype=torch.int32),
        "prompt_feat": torch.randn(batch, 2 * p_max, 80, generator=g),
        "embedding": torch.randn(batch, 12, generator=g),
    }


def run(flow: Flow, x: dict, b: slice, n: int, p: int, **kw) -> torch.Tensor:
    return flow.inference(
        x["token"][b, :n], [n], x["prompt_token"][b, :p], [p], x["prompt_feat"][b, : 2 * p], [2 * p],
        x["embedding"][b], **kw,
    )  # fmt: skip


def test_batched_rows_equal_solo_runs(flow: Flow) -> None:
    rows = [(21, 6), (5, 11), (13, 0), (9, 9)]
    streaming, finalize = [True, False, True, False], [False, True, True, False]
    x = random_inputs(rows)
    mel = flow.inference(
        x["token"], [r[0] for r in rows], x["prompt_token"], [r[1] for r in rows], x["prompt_feat"],
        [2 * r[1] for r in rows], x["embedding"], streaming=streaming, finalize=finalize,
    )  # fmt: skip
    lengths = flow.mel_lengths([r[0] for r in rows], [r[1] for r in rows], [2 * r[1] for r in rows], finalize)
    assert lengths == [2 * (n - (0 if f else 3)) for (n, _), f in zip(rows, finalize, strict=True)]
    assert mel.shape == (4, 80, max(lengths))
    for b, (n, p) in enumerate(rows):
        solo = run(flow, x, slice(b, b + 1), n, p, streaming=streaming[b], finalize=finalize[b])
        assert solo.shape == (1, 80, lengths[b])
        torch.testing.assert_close(mel[b : b + 1, :, : lengths[b]], solo, atol=1e-5, rtol=0)
        assert torch.all(mel[b, :, lengths[b] :] == 0)


def test_output_is_deterministic_and_finite(flow: Flow) -> None:
    x = random_inputs([(12, 5)], seed=3)
    a = run(flow, x, slice(0, 1), 12, 5)
    b = run(flow, x, slice(0, 1), 12, 5)
    assert torch.equal(a, b)
    assert torch.isfinite(a).all() and a.abs().max() > 0


def test_streaming_hop_equals_prefix_of_longer_streaming_call(flow: Flow) -> None:
    # Prompt 5 + hop 7 tokens = 12 tokens = 24 frames = 3 whole chunks; 3 more tokens are look-ahead.
    x = random_inputs([(30, 5)], seed=5)
    hop = run(flow, x, slice(0, 1), 10, 5, streaming=True, finalize=False)
    longer = run(flow, x, slice(0, 1), 30, 5, streaming=True, finalize=True)
    assert hop.shape[2] == 2 * 7
    torch.testing.assert_close(hop, longer[:, :, : hop.shape[2]], atol=1e-5, rtol=0)


def test_chunk_mask_hides_future_chunks_only_when_streaming(flow: Flow) -> None:
    x = random_inputs([(30, 4)], seed=7)
    changed = {k: v.clone() for k, v in x.items()}
    changed["token"][0, 20:] = (changed["token"][0, 20:] + 1) % VOCAB  # sequence tokens 24..33
    # Chunk c (frames 8c..8c+7) sees tokens <= 4c+3 plus 3 look-ahead: chunks 1..4 never see token 24.
    for streaming, same in ((True, True), (False, False)):
        a = run(flow, x, slice(0, 1), 30, 4, streaming=streaming)
        b = run(flow, changed, slice(0, 1), 30, 4, streaming=streaming)
        first_chunks = slice(0, 4 * CHUNK)  # output frames 0..31 = sequence frames 8..39
        assert torch.allclose(a[:, :, first_chunks], b[:, :, first_chunks], atol=1e-6) is same
        assert not torch.allclose(a[:, :, -4:], b[:, :, -4:], atol=1e-6)


def test_chunk_mask_semantics() -> None:
    mask = chunk_mask(7, 3)
    expected = torch.tensor([[j < (i // 3 + 1) * 3 for j in range(7)] for i in range(7)])
    assert torch.equal(mask, expected)
    limited = chunk_mask(7, 2, num_left_chunks=1)
    assert limited[5].tolist() == [False, False, True, True, True, True, False]
    assert limited[0].tolist() == [True, True] + [False] * 5


def test_attention_mask_padding_rows_and_cfg_repeat() -> None:
    assert attention_mask([6, 6], [False, False], chunk_size=3) is None
    assert attention_mask([6, 6], [True, True], chunk_size=3).shape == (1, 1, 6, 6)
    assert attention_mask([6, 6], [True, True], chunk_size=0) is None
    mask = attention_mask([6, 4], [True, False], chunk_size=3, repeat=2)
    assert mask.shape == (4, 1, 6, 6)
    assert torch.equal(mask[0, 0], chunk_mask(6, 3))
    assert mask[1, 0, :4].tolist() == [[True] * 4 + [False] * 2] * 4  # full attention over 4 valid keys
    assert torch.equal(mask[2:], mask[:2])  # the uncond copy has the same mask
    assert mask.any(dim=-1).all()  # no query row is left without a key


def test_fixed_noise_matches_official_recipe_and_keeps_global_rng() -> None:
    state = torch.random.get_rng_state()
    noise = fixed_noise()
    assert torch.equal(torch.random.get_rng_state(), state)
    assert noise.shape == (1, 80, 15000) and noise.dtype == torch.float32
    assert torch.equal(noise, fixed_noise())
    torch.manual_seed(0)
    official = torch.randn([1, 80, 50 * 300])
    torch.random.set_rng_state(state)
    assert torch.equal(noise, official)
    torch.testing.assert_close(
        noise[0, 0, :4], torch.tensor([-1.1258, -1.1524, -0.2506, -0.4339]), atol=1e-4, rtol=0
    )


def test_flow_uses_position_locked_noise(flow: Flow) -> None:
    # Same start of the sequence, different global RNG state: a streaming hop must not change.
    x = random_inputs([(12, 5)], seed=9)
    torch.manual_seed(1)
    a = run(flow, x, slice(0, 1), 12, 5, streaming=True, finalize=False)
    torch.manual_seed(2)
    b = run(flow, x, slice(0, 1), 12, 5, streaming=True, finalize=False)
    assert torch.equal(a, b)


def test_euler_schedule_cosine() -> None:
    t, dt = euler_schedule(10)
    span = 1 - torch.cos(torch.linspace(0, 1, 11) * 0.5 * torch.pi)
    assert t.shape == dt.shape == (10,)
    assert t[0] == 0
    torch.testing.assert_close(t + dt, span[1:], atol=1e-6, rtol=0)
    torch.testing.assert_close(dt.sum(), torch.tensor(1.0), atol=1e-6, rtol=0)
    with pytest.raises(FlowInputError):
        euler_schedule(0)


def test_cfg_rate_zero_equals_conditional_branch_only(flow: Flow) -> None:
    x = random_inputs([(10, 4)], seed=11)
    plain = run(flow, x, slice(0, 1), 10, 4, cfg_rate=0.0)
    guided = run(flow, x, slice(0, 1), 10, 4, cfg_rate=0.7)
    assert plain.shape == guided.shape and not torch.allclose(plain, guided)


def test_attention_rotates_only_head_zero_with_interleaved_pairs() -> None:
    torch.manual_seed(0)
    heads, dim_head, dim, seq = 3, 8, 24, 5
    attn = Attention(dim, heads, dim_head)
    h = torch.randn(2, seq, dim)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim_head, 2).float() / dim_head))
    with torch.no_grad():
        out = attn(h, rotary_tables(inv_freq, seq), None)
        q, k, v = attn.qkv(h).chunk(3, dim=-1)  # [B, T, H * Dh] each
        angle = torch.arange(seq).float()[:, None] * inv_freq  # [T, Dh / 2]
        cos, sin = angle.cos(), angle.sin()

        def rotate(x: torch.Tensor) -> torch.Tensor:  # pairs (2i, 2i + 1) of head 0 only
            x = x.clone()
            even, odd = x[..., 0:dim_head:2].clone(), x[..., 1:dim_head:2].clone()
            x[..., 0:dim_head:2] = even * cos - odd * sin
            x[..., 1:dim_head:2] = odd * cos + even * sin
            return x

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(2, seq, heads, dim_head).transpose(1, 2)  # [B, H, T, Dh]

        ref = torch.softmax(
            split(rotate(q)) @ split(rotate(k)).transpose(-1, -2) / dim_head**0.5, -1
        ) @ split(v)
        ref = attn.out(ref.transpose(1, 2).reshape(2, seq, dim))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def official_state_dict(cfg: FlowConfig) -> dict[str, torch.Tensor]:
    d, e = cfg.dit, "decoder.estimator."
    shapes = {
        "input_embedding.weight": (cfg.vocab_size, cfg.mel_dim),
        "spk_embed_affine_layer.weight": (cfg.mel_dim, cfg.spk_embed_dim),
        "spk_embed_affine_layer.bias": (cfg.mel_dim,),
        "pre_lookahead_layer.conv1.weight": (
            cfg.pre_lookahead_channels, cfg.mel_dim, cfg.pre_lookahead_len + 1
        ),
        "pre_lookahead_layer.conv1.bias": (cfg.pre_lookahead_channels,),
        "pre_lookahead_layer.conv2.weight": (cfg.mel_dim, cfg.pre_lookahead_channels, 3),
        "pre_lookahead_layer.conv2.bias": (cfg.mel_dim,),
        f"{e}time_embed.time_mlp.0.weight": (d.dim, 256),
        f"{e}time_embed.time_mlp.0.bias": (d.dim,),
        f"{e}time_embed.time_mlp.2.weight": (d.dim, d.dim),
        f"{e}time_embed.time_mlp.2.bias": (d.dim,),
        f"{e}input_embed.proj.weight": (d.dim, d.in_dim),
        f"{e}input_embed.proj.bias": (d.dim,),
        f"{e}rotary_embed.inv_freq": (d.dim_head // 2,),
        f"{e}norm_out.linear.weight": (2 * d.dim, d.dim),
        f"{e}norm_out.linear.bias": (2 * d.dim,),
        f"{e}proj_out.weight": (d.mel_dim, d.dim),
        f"{e}proj_out.bias": (d.mel_dim,),
    }
    for conv in ("conv1", "conv2"):
        shapes[f"{e}input_embed.conv_pos_embed.{conv}.0.weight"] = (
            d.dim,
            d.dim // d.conv_groups,
            d.conv_kernel,
        )
        shapes[f"{e}input_embed.conv_pos_embed.{conv}.0.bias"] = (d.dim,)
    for i in range(d.depth):
        b = f"{e}transformer_blocks.{i}."
        layers = {"attn_norm.linear": (6 * d.dim, d.dim), "attn.to_out.0": (d.dim, d.inner_dim)}
        layers |= {f"attn.to_{n}": (d.inner_dim, d.dim) for n in "qkv"}
        layers |= {"ff.ff.0.0": (d.ff_dim, d.dim), "ff.ff.2": (d.dim, d.ff_dim)}
        for name, shape in layers.items():
            shapes[f"{b}{name}.weight"] = shape
            shapes[f"{b}{name}.bias"] = shape[:1]
    g = torch.Generator().manual_seed(0)
    return {k: 0.1 * torch.randn(s, generator=g) for k, s in shapes.items()}


def test_load_official_layout_infers_sizes_and_maps_weights() -> None:
    cfg = tiny_config()
    state = official_state_dict(cfg)
    flow = Flow.from_state_dict(state, static_chunk_size=CHUNK)
    assert flow.cfg.dit == cfg.dit and flow.cfg.vocab_size == VOCAB and flow.cfg.pre_lookahead_len == 3
    block = flow.decoder.estimator.blocks[1]
    prefix = "decoder.estimator.transformer_blocks.1.attn."
    assert torch.equal(block.attn.qkv.weight[32:64], state[prefix + "to_k.weight"])
    mod = flow.decoder.estimator.modulation.weight
    assert torch.equal(
        mod[6 * 32 : 12 * 32], state["decoder.estimator.transformer_blocks.1.attn_norm.linear.weight"]
    )
    assert torch.equal(mod[12 * 32 :], state["decoder.estimator.norm_out.linear.weight"])


def test_load_errors_name_the_key() -> None:
    state = official_state_dict(tiny_config())
    missing = dict(state)
    del missing["decoder.estimator.transformer_blocks.0.attn.to_v.bias"]
    with pytest.raises(FlowCheckpointError, match="to_v.bias"):
        Flow.from_state_dict(missing, source="flow.pt")
    with pytest.raises(FlowCheckpointError, match="extra.weight"):
        Flow.from_state_dict({**state, "extra.weight": torch.zeros(1)})
    wrong = {**state, "decoder.estimator.proj_out.bias": torch.zeros(3)}
    with pytest.raises(FlowCheckpointError, match="proj_out"):
        Flow.from_state_dict(wrong)


def test_bad_inputs_raise_flow_input_error(flow: Flow) -> None:
    x = random_inputs([(10, 4)])
    with pytest.raises(FlowInputError, match="vocab"):
        bad = {**x, "token": x["token"].clone().fill_(VOCAB)}
        run(flow, bad, slice(0, 1), 10, 4)
    with pytest.raises(FlowInputError, match="look-ahead"):
        run(flow, x, slice(0, 1), 2, 4, finalize=False)
    with pytest.raises(FlowInputError, match="integer"):
        flow.inference(
            x["token"].float(), [10], x["prompt_token"], [4], x["prompt_feat"], [8], x["embedding"]
        )
    with pytest.raises(FlowInputError, match="exceed"):
        flow.inference(x["token"], [2], x["prompt_token"], [1], x["prompt_feat"], [8], x["embedding"])
    with pytest.raises(FlowInputError):
        flow.inference(x["token"], [10, 3], x["prompt_token"], [4], x["prompt_feat"], [8], x["embedding"])
