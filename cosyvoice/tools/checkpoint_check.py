"""Checkpoint checks: is ``llm.pt`` / ``flow.pt`` / ``hift.pt`` readable, whole, and shaped as our modules expect?

Keys and shapes are compared with what our modules expect for the yaml (built on the meta device where
our module's keys are the file's, written out for the flow, whose DiT our loader fuses); a renamed key
is reported with the closest unexpected one. Opened with ``mmap=True``: only the zip index is read.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from pathlib import Path

import torch

from cosyvoice.config import YAML_NAME, CosyVoice3Config
from cosyvoice.hift import CausalHift, HiftNoiseBuffers
from cosyvoice.llm.lm import IGNORED_KEYS, CosyVoice3LM
from cosyvoice.tools.check_finding import (
    FAILED,
    NOT_A_RELEASE,
    OK,
    RELEASE_SIZES,
    SKIPPED,
    Finding,
    first_sentence,
    human_size,
    listed,
)

__all__ = ["check_checkpoint", "expected_checkpoint_shapes"]

def _llm_shapes(config: CosyVoice3Config) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return CosyVoice3LM.from_config(config.llm).checkpoint_shapes()


def _flow_shapes(config: CosyVoice3Config) -> dict[str, tuple[int, ...]]:
    flow, dit = config.flow, config.flow.dit
    mel, d, inner, ff = flow.mel_dim, dit.dim, dit.inner_dim, dit.ff_dim
    channels = flow.pre_lookahead_channels
    shapes: dict[str, tuple[int, ...]] = {
        "input_embedding.weight": (flow.vocab_size, mel),
        "spk_embed_affine_layer.weight": (mel, flow.spk_embed_dim),
        "spk_embed_affine_layer.bias": (mel,),
        "pre_lookahead_layer.conv1.weight": (channels, mel, flow.pre_lookahead_len + 1),
        "pre_lookahead_layer.conv1.bias": (channels,),
        "pre_lookahead_layer.conv2.weight": (mel, channels, 3),
        "pre_lookahead_layer.conv2.bias": (mel,),
    }

    def linear(key: str, out_dim: int, in_dim: int) -> None:
        shapes[f"decoder.estimator.{key}.weight"] = (out_dim, in_dim)
        shapes[f"decoder.estimator.{key}.bias"] = (out_dim,)

    linear("time_embed.time_mlp.0", d, dit.freq_embed_dim)
    linear("time_embed.time_mlp.2", d, d)
    linear("input_embed.proj", d, dit.in_dim)
    for conv in ("conv1", "conv2"):
        key = f"decoder.estimator.input_embed.conv_pos_embed.{conv}.0"
        shapes[f"{key}.weight"] = (d, d // dit.conv_groups, dit.conv_kernel)
        shapes[f"{key}.bias"] = (d,)
    shapes["decoder.estimator.rotary_embed.inv_freq"] = (dit.dim_head // 2,)
    for i in range(dit.depth):
        block = f"transformer_blocks.{i}"
        linear(f"{block}.attn_norm.linear", 6 * d, d)
        for name in ("to_q", "to_k", "to_v"):
            linear(f"{block}.attn.{name}", inner, d)
        linear(f"{block}.attn.to_out.0", d, inner)
        linear(f"{block}.ff.ff.0.0", ff, d)
        linear(f"{block}.ff.ff.2", d, ff)
    linear("norm_out.linear", 2 * d, d)
    linear("proj_out", dit.mel_dim, d)
    return shapes


def _hift_shapes(config: CosyVoice3Config) -> dict[str, tuple[int, ...]]:
    harmonics = config.hift.nb_harmonics + 1
    buffers = HiftNoiseBuffers(
        rand_ini=torch.zeros(1, harmonics), sine_noise=torch.zeros(1, 1, harmonics), uv_noise=None
    )
    with torch.device("meta"):
        module = CausalHift(config.hift, buffers)
    return {key: tuple(value.shape) for key, value in module.state_dict().items()}


_WEIGHT_NORM = {
    ".parametrizations.weight.original1": ".weight",  # v: the weight's shape
    ".weight_v": ".weight",
    ".parametrizations.weight.original0": None,  # g: folded into the weight
    ".weight_g": None,
}


def _hift_file_shapes(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for key, value in state.items():
        key = key.removeprefix("generator.")
        for suffix, replacement in _WEIGHT_NORM.items():
            if key.endswith(suffix):
                if replacement is None:
                    break
                shapes[key[: -len(suffix)] + replacement] = tuple(value.shape)
                break
        else:
            shapes[key] = tuple(value.shape)
    return shapes


def expected_checkpoint_shapes(config: CosyVoice3Config, file: str) -> dict[str, tuple[int, ...]]:
    """Key -> shape our modules expect in ``file`` (llm.pt / flow.pt / hift.pt) for this yaml."""
    builders = {"llm.pt": _llm_shapes, "flow.pt": _flow_shapes, "hift.pt": _hift_shapes}
    return builders[file](config)


def _read_checkpoint(path: Path) -> Mapping[str, torch.Tensor]:
    try:  # mmap: only the zip index is read; tensors stay on disk
        return torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - an old (non-zip) format cannot be mapped; read it whole
        return torch.load(path, weights_only=True, map_location="cpu")


def check_checkpoint(model_dir: Path, file: str, config: CosyVoice3Config | None) -> Finding:
    path = model_dir / file
    if not path.is_file():
        return Finding(file, SKIPPED, "file missing (see files)", file=file)
    size = path.stat().st_size
    expected = expected_checkpoint_shapes(config, file) if config is not None else None
    expected_bytes = sum(4 * math.prod(shape) for shape in expected.values()) if expected else None
    published = f"expected ~{human_size(expected_bytes or RELEASE_SIZES[file])}"
    try:
        state = _read_checkpoint(path)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a broken file
        return Finding(
            file,
            FAILED,
            f"cannot be read ({first_sentence(exc)}): it is {human_size(size)}, {published}",
            f"re-download {file}: it is truncated or corrupt",
            file,
        )
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return Finding(file, FAILED, "is not a state dict of tensors", f"{NOT_A_RELEASE}", file)
    if expected is None:
        return Finding(
            file, SKIPPED, f"readable ({len(state)} tensors); keys not checked: the yaml failed", file=file
        )
    got = (
        _hift_file_shapes(state) if file == "hift.pt" else dict((k, tuple(v.shape)) for k, v in state.items())
    )
    if file == "llm.pt":
        got = {key: shape for key, shape in got.items() if key not in IGNORED_KEYS}  # the tied text head
    missing = sorted(expected.keys() - got.keys())
    unexpected = sorted(got.keys() - expected.keys())
    wrong = [
        f"{key} {list(got[key])} (expected {list(shape)})"
        for key, shape in sorted(expected.items())
        if key in got and got[key] != shape
    ]
    if missing:
        key = missing[0]
        close = difflib.get_close_matches(key, unexpected, n=1, cutoff=0.6)
        found = (
            f"found {close[0]!r} instead, renamed?"
            if close
            else f"found {listed(unexpected) or 'no other key'}"
        )
        more = f"; {len(missing)} keys missing in all" if len(missing) > 1 else ""
        return Finding(
            file, FAILED, f"lacks key {key!r} ({found}){more}", f"re-download {file}; {NOT_A_RELEASE}", file
        )
    if unexpected:
        return Finding(
            file,
            FAILED,
            f"unexpected keys {listed(unexpected)}",
            f"re-download {file}; {NOT_A_RELEASE}",
            file,
        )
    if wrong:
        return Finding(
            file,
            FAILED,
            f"shape mismatch for this {YAML_NAME}: {listed(wrong)}",
            f"{file} and {YAML_NAME} come from different models: re-download both",
            file,
        )
    stored = sum(4 * math.prod(shape) for shape in expected.values())
    if size < 0.9 * stored * (0.5 if _half_precision(state) else 1.0):
        return Finding(
            file,
            FAILED,
            f"it is {human_size(size)}, {published}",
            f"re-download {file}: it is truncated",
            file,
        )
    return Finding(file, OK, f"{len(expected)} keys and shapes match; {human_size(size)}")


def _half_precision(state: Mapping[str, torch.Tensor]) -> bool:
    return any(value.element_size() < 4 for value in state.values())
