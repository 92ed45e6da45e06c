"""Write a random-weight CosyVoice3 model directory in the official release format.

    python scripts/make_tiny_model.py OUT_DIR [--preset tiny|full] [--seed N] [--rl-llm] [--no-onnx]

or, from Python (tests, benchmarks)::

    from scripts.make_tiny_model import make_model_dir
    model_dir = make_model_dir(tmp_path / "model", preset="tiny", seed=0)

Contents: ``cosyvoice3.yaml`` (``tiny_model_yaml``: our own template with the release's classes, tags and
layout), ``llm.pt`` / ``flow.pt`` / ``hift.pt`` float32 state dicts with the release key layout
(``llm.model.model.*`` Qwen2 keys with the tied ``lm_head`` sharing ``embed_tokens``' storage; ``decoder.estimator.*`` DiT keys;
HiFT weight norm as ``parametrizations.weight.original0/1``), optionally ``llm.rl.pt`` (same layout, other
weights), ``CosyVoice-BlankEN/{config.json, generation_config.json, vocab.json, merges.txt,
tokenizer_config.json}`` (a small generated BPE, see ``tiny_model_assets``) and, when the ``onnx`` package
is importable, stand-ins for ``campplus.onnx`` and ``speech_tokenizer_v3.onnx``. BlankEN's
``model.safetensors`` is not written: our loader never reads it.

Presets: ``tiny`` (the dimensions of the v3-tiny parity fixtures: LLM hidden 24 / 2 layers, DiT 64 / depth 2,
HiFT 32 channels; ~20 MB, a second to write) and ``full`` (the Fun-CosyVoice3-0.5B-2512 dimensions; about
3.4 GB of random weights, for benchmarks only, never committed).

Weights are scaled for sane activations: linear/conv weights ~ N(0, 1/fan_in), norms and weight-norm
gains near 1, embeddings ~ N(0, 1), LLM head logits with a spread of about 4 nats. The 200 stop rows of the
LLM head are damped, so a generation practically always runs to its max length (20 x text tokens) - a
deterministic length for tests and benchmarks. The HiFT output layer biases the log-magnitude low and the
f0 head high (mostly voiced), which keeps waveforms mostly inside the +-0.99 clamp. ``yaml`` is written
last, so a directory with ``cosyvoice3.yaml`` is complete.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from scripts.tiny_model_assets import write_onnx_models, write_tokenizer  # noqa: E402
from scripts.tiny_model_yaml import render_yaml  # noqa: E402

__all__ = ["PRESETS", "Preset", "bench_model_dir", "make_model_dir"]

TEXT_VOCAB = 151936  # rows of Qwen2's embed_tokens
SPEECH_CODES = 6561
SPEECH_ROWS = SPEECH_CODES + 200
MEL = 80
SPK = 192
HIFT_RATES = (8, 5, 3)
HIFT_UP_KERNELS = (16, 11, 7)
HIFT_KERNELS = (3, 7, 11)
HIFT_SOURCE_KERNELS = (7, 7, 11)
HIFT_DILATIONS = (1, 3, 5)
STFT_CHANNELS = 18  # n_fft 16 -> 9 magnitude + 9 phase bins


@dataclass(frozen=True, slots=True)
class Preset:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    lookahead_channels: int
    dit_dim: int
    dit_depth: int
    dit_heads: int
    dit_dim_head: int
    dit_ff_mult: int
    hift_channels: int
    f0_channels: int


PRESETS: dict[str, Preset] = {
    "tiny": Preset(24, 2, 4, 2, 64, 64, 64, 2, 4, 16, 2, 32, 32),
    "full": Preset(896, 24, 14, 2, 4864, 1024, 1024, 22, 16, 64, 2, 512, 512),
}


class _Weights:
    """Draws tensors from one seeded CPU generator, in a fixed order (reproducible per seed)."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def normal(self, *shape: int, std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen) * std + mean

    def linear(self, state: dict, key: str, out_dim: int, in_dim: int, *, bias: bool = True) -> None:
        state[f"{key}.weight"] = self.normal(out_dim, in_dim, std=1 / math.sqrt(in_dim))
        if bias:
            state[f"{key}.bias"] = self.normal(out_dim, std=0.05)

    def conv(self, state: dict, key: str, out_ch: int, in_ch: int, kernel: int) -> None:
        state[f"{key}.weight"] = self.normal(out_ch, in_ch, kernel, std=1 / math.sqrt(in_ch * kernel))
        state[f"{key}.bias"] = self.normal(out_ch, std=0.05)

    def wn_conv(self, state: dict, key: str, out_ch: int, in_ch: int, kernel: int, gain: float = 1.0) -> None:
        """A weight-normed conv in the parametrization layout: g [out, 1, 1], v [out, in, k]."""
        state[f"{key}.bias"] = self.normal(out_ch, std=0.05)
        state[f"{key}.parametrizations.weight.original0"] = self.normal(
            out_ch, 1, 1, std=0.1 * gain, mean=gain
        )
        state[f"{key}.parametrizations.weight.original1"] = self.normal(
            out_ch, in_ch, kernel, std=1 / math.sqrt(in_ch * kernel)
        )


def llm_state_dict(p: Preset, seed: int) -> dict[str, torch.Tensor]:
    w = _Weights(seed)
    head_dim = p.hidden // p.heads
    prefix = "llm.model.model."
    embed = w.normal(TEXT_VOCAB, p.hidden, std=1.0)
    state: dict[str, torch.Tensor] = {f"{prefix}embed_tokens.weight": embed}
    for i in range(p.layers):
        layer = f"{prefix}layers.{i}."
        w.linear(state, layer + "self_attn.q_proj", p.heads * head_dim, p.hidden)
        w.linear(state, layer + "self_attn.k_proj", p.kv_heads * head_dim, p.hidden)
        w.linear(state, layer + "self_attn.v_proj", p.kv_heads * head_dim, p.hidden)
        w.linear(state, layer + "self_attn.o_proj", p.hidden, p.heads * head_dim, bias=False)
        w.linear(state, layer + "mlp.gate_proj", p.intermediate, p.hidden, bias=False)
        w.linear(state, layer + "mlp.up_proj", p.intermediate, p.hidden, bias=False)
        w.linear(state, layer + "mlp.down_proj", p.hidden, p.intermediate, bias=False)
        state[layer + "input_layernorm.weight"] = w.normal(p.hidden, std=0.1, mean=1.0)
        state[layer + "post_attention_layernorm.weight"] = w.normal(p.hidden, std=0.1, mean=1.0)
    state[f"{prefix}norm.weight"] = w.normal(p.hidden, std=0.1, mean=1.0)
    state["llm.model.lm_head.weight"] = embed  # tied: saved once through the shared storage
    decoder = w.normal(SPEECH_ROWS, p.hidden, std=4.0 / math.sqrt(p.hidden))  # logits spread ~4 nats
    decoder[SPEECH_CODES:] *= 0.25  # damped stop rows: generations run to max_len
    state["llm_decoder.weight"] = decoder
    state["speech_embedding.weight"] = w.normal(SPEECH_ROWS, p.hidden, std=1.0)
    return state


def flow_state_dict(p: Preset, seed: int) -> dict[str, torch.Tensor]:
    w = _Weights(seed)
    d, inner, ff = p.dit_dim, p.dit_heads * p.dit_dim_head, p.dit_dim * p.dit_ff_mult
    state: dict[str, torch.Tensor] = {"input_embedding.weight": w.normal(SPEECH_CODES, MEL, std=1.0)}
    state["spk_embed_affine_layer.weight"] = w.normal(MEL, SPK, std=1.0)  # input is L2-normalised
    state["spk_embed_affine_layer.bias"] = w.normal(MEL, std=0.05)
    w.conv(state, "pre_lookahead_layer.conv1", p.lookahead_channels, MEL, 4)
    w.conv(state, "pre_lookahead_layer.conv2", MEL, p.lookahead_channels, 3)
    est = "decoder.estimator."
    w.linear(state, est + "time_embed.time_mlp.0", d, 256)
    w.linear(state, est + "time_embed.time_mlp.2", d, d)
    w.linear(state, est + "input_embed.proj", d, 4 * MEL)  # x, cond, mu, spk
    for name in ("conv1", "conv2"):
        w.conv(state, f"{est}input_embed.conv_pos_embed.{name}.0", d, d // 16, 31)  # groups 16
    exponents = torch.arange(0, p.dit_dim_head, 2, dtype=torch.float32) / p.dit_dim_head
    state[est + "rotary_embed.inv_freq"] = 1.0 / (10000.0**exponents)  # [dim_head / 2]
    for i in range(p.dit_depth):
        block = f"{est}transformer_blocks.{i}."
        w.linear(state, block + "attn_norm.linear", 6 * d, d)
        for name in ("to_q", "to_k", "to_v"):
            w.linear(state, block + f"attn.{name}", inner, d)
        w.linear(state, block + "attn.to_out.0", d, inner)
        w.linear(state, block + "ff.ff.0.0", ff, d)
        w.linear(state, block + "ff.ff.2", d, ff)
    w.linear(state, est + "norm_out.linear", 2 * d, d)
    w.linear(state, est + "proj_out", MEL, d)
    return state


def _resblock(w: _Weights, state: dict, key: str, channels: int, kernel: int) -> None:
    for conv_set in ("convs1", "convs2"):
        for j in range(len(HIFT_DILATIONS)):
            w.wn_conv(state, f"{key}.{conv_set}.{j}", channels, channels, kernel)
    for act_set in ("activations1", "activations2"):
        for j in range(len(HIFT_DILATIONS)):
            state[f"{key}.{act_set}.{j}.alpha"] = w.normal(channels, std=0.1, mean=1.0)


def hift_state_dict(p: Preset, seed: int) -> dict[str, torch.Tensor]:
    w = _Weights(seed)
    base = p.hift_channels
    state: dict[str, torch.Tensor] = {}
    w.linear(state, "m_source.l_linear", 1, 9)
    w.wn_conv(state, "conv_pre", base, MEL, 5)
    channels = [base // 2 ** (i + 1) for i in range(len(HIFT_RATES))]
    for i, (ch, kernel) in enumerate(zip(channels, HIFT_UP_KERNELS, strict=True)):
        w.wn_conv(state, f"ups.{i}", ch, base // 2**i, kernel)
    for i, ch in enumerate(channels):
        stride = math.prod(HIFT_RATES[i + 1 :])
        w.conv(state, f"source_downs.{i}", ch, STFT_CHANNELS, 2 * stride if stride > 1 else 1)
    for i, (ch, kernel) in enumerate(zip(channels, HIFT_SOURCE_KERNELS, strict=True)):
        _resblock(w, state, f"source_resblocks.{i}", ch, kernel)
    for i, ch in enumerate(channels):
        for j, kernel in enumerate(HIFT_KERNELS):
            _resblock(w, state, f"resblocks.{i * len(HIFT_KERNELS) + j}", ch, kernel)
    w.wn_conv(state, "conv_post", STFT_CHANNELS, channels[-1], 7, gain=0.3)
    # log-magnitude bins start low (quiet output), phase bins centred
    state["conv_post.bias"] = torch.cat([torch.full((9,), -2.0), torch.zeros(9)])
    f0 = p.f0_channels
    w.wn_conv(state, "f0_predictor.condnet.0", f0, MEL, 4)
    for i in (2, 4, 6, 8):
        w.wn_conv(state, f"f0_predictor.condnet.{i}", f0, f0, 3)
    state["f0_predictor.classifier.weight"] = w.normal(1, f0, std=87.0 / math.sqrt(f0))
    state["f0_predictor.classifier.bias"] = torch.tensor([50.0])  # f0 = |.|, mostly above 10 Hz: voiced
    return state


def _qwen_config(p: Preset) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": p.hidden,
        "initializer_range": 0.02,
        "intermediate_size": p.intermediate,
        "max_position_embeddings": 32768,
        "max_window_layers": p.layers,
        "model_type": "qwen2",
        "num_attention_heads": p.heads,
        "num_hidden_layers": p.layers,
        "num_key_value_heads": p.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": TEXT_VOCAB,
    }


def _save(state: dict[str, torch.Tensor], path: Path) -> None:
    tmp = path.with_name(path.name + ".part")
    torch.save(state, tmp)
    os.replace(tmp, path)


def make_model_dir(
    out_dir: str | Path,
    preset: str = "tiny",
    seed: int = 0,
    *,
    rl_llm: bool = False,
    onnx_models: bool | None = None,
) -> Path:
    """Write a complete random-weight model directory and return its path.

    ``rl_llm`` also writes ``llm.rl.pt`` (other weights). ``onnx_models``: True requires the ``onnx``
    package, False skips the two ONNX files, None (default) writes them when ``onnx`` is importable.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    out = Path(out_dir)
    blank_en = out / "CosyVoice-BlankEN"
    blank_en.mkdir(parents=True, exist_ok=True)
    (out / "cosyvoice3.yaml").unlink(missing_ok=True)  # the completeness marker goes last
    _save(llm_state_dict(p, seed), out / "llm.pt")
    if rl_llm:
        _save(llm_state_dict(p, seed + 1000), out / "llm.rl.pt")
    _save(flow_state_dict(p, seed + 1), out / "flow.pt")
    _save(hift_state_dict(p, seed + 2), out / "hift.pt")
    (blank_en / "config.json").write_text(json.dumps(_qwen_config(p), indent=2) + "\n", encoding="utf-8")
    generation = {"bos_token_id": 151643, "eos_token_id": 151643, "max_new_tokens": 2048}
    (blank_en / "generation_config.json").write_text(
        json.dumps(generation, indent=2) + "\n", encoding="utf-8"
    )
    write_tokenizer(blank_en)
    if onnx_models is not False:
        try:
            write_onnx_models(out, np.random.default_rng(seed + 3))
        except ImportError as exc:
            if onnx_models:
                raise ImportError(
                    "writing campplus.onnx / speech_tokenizer_v3.onnx needs the 'onnx' package "
                    "(pip install onnx, or the project's test extra)"
                ) from exc
            print(
                f"note: 'onnx' is not installed; {out} has no campplus.onnx / speech_tokenizer_v3.onnx "
                "(synthesis with prepared speakers still works)",
                file=sys.stderr,
            )
    yaml_text = render_yaml(
        preset=preset,
        hidden=p.hidden,
        lookahead_channels=p.lookahead_channels,
        dit_dim=p.dit_dim,
        dit_depth=p.dit_depth,
        dit_heads=p.dit_heads,
        dit_dim_head=p.dit_dim_head,
        dit_ff_mult=p.dit_ff_mult,
        hift_channels=p.hift_channels,
        f0_channels=p.f0_channels,
    )
    (out / "cosyvoice3.yaml").write_text(yaml_text, encoding="utf-8")
    return out


def bench_model_dir(preset: str, seed: int = 0, model_dir: Path | None = None) -> Path:
    """``model_dir``, else the benchmarks' random-weight ``preset`` model under ``models/.bench`` (written
    there, without the ONNX frontend, the first time it is asked for)."""
    model_dir = model_dir or REPO_ROOT / "models" / ".bench" / f"{preset}-seed{seed}"
    if not (model_dir / "cosyvoice3.yaml").is_file():
        print(f"writing a random-weight {preset} model to {model_dir} ...", file=sys.stderr)
        make_model_dir(model_dir, preset, seed=seed, onnx_models=False)
    return model_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rl-llm", action="store_true", help="also write llm.rl.pt")
    parser.add_argument("--no-onnx", action="store_true", help="skip the two ONNX stand-ins")
    args = parser.parse_args(argv)
    path = make_model_dir(
        args.out_dir, args.preset, args.seed, rl_llm=args.rl_llm, onnx_models=False if args.no_onnx else None
    )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
