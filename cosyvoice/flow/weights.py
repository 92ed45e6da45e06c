"""Map an official `flow.pt` state dict onto our flow modules (with shape checks and clear errors).

Official key layout (prefix ``decoder.estimator.`` for the DiT):

* ``input_embedding.weight`` [V, 80], ``spk_embed_affine_layer.{weight [80, 192], bias}``
* ``pre_lookahead_layer.conv1.{weight [C, 80, L+1], bias}``, ``pre_lookahead_layer.conv2.{weight [80, C, 3], bias}``
* DiT: ``time_embed.time_mlp.{0,2}``, ``input_embed.proj``, ``input_embed.conv_pos_embed.{conv1,conv2}.0``,
  ``rotary_embed.inv_freq``, ``transformer_blocks.N.{attn_norm.linear, attn.to_{q,k,v}, attn.to_out.0,
  ff.ff.0.0, ff.ff.2}``, ``norm_out.linear``, ``proj_out``.

q/k/v are fused into one linear and every AdaLN linear is stacked into ``DiT.modulation``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from .config import DiTConfig
from .dit import DiT
from .errors import FlowCheckpointError

ESTIMATOR_PREFIX = "decoder.estimator."


def load_flow_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Read ``flow.pt`` safely (weights only, on CPU)."""
    path = Path(path)
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError as exc:
        raise FlowCheckpointError(f"{path}: file not found") from exc
    if not isinstance(state, Mapping):
        raise FlowCheckpointError(f"{path}: expected a state dict, got {type(state).__name__}")
    return dict(state)


class StateDictReader:
    """Takes tensors out of a state dict by key, checking shapes and remembering what was used."""

    def __init__(self, state: Mapping[str, Tensor], source: str) -> None:
        self.state = state
        self.source = source
        self.used: set[str] = set()

    def get(self, key: str, shape: tuple[int, ...] | None = None) -> Tensor:
        if key not in self.state:
            raise FlowCheckpointError(f"{self.source}: missing key {key!r}")
        value = self.state[key]
        if shape is not None and tuple(value.shape) != shape:
            raise FlowCheckpointError(
                f"{self.source}: key {key!r} has shape {tuple(value.shape)}, expected {shape}"
            )
        self.used.add(key)
        return value

    def shape(self, key: str) -> tuple[int, ...]:
        if key not in self.state:
            raise FlowCheckpointError(f"{self.source}: missing key {key!r}")
        return tuple(self.state[key].shape)

    def check_all_used(self, prefix: str = "") -> None:
        extra = sorted(k for k in self.state if k.startswith(prefix) and k not in self.used)
        if extra:
            raise FlowCheckpointError(f"{self.source}: unexpected key {extra[0]!r} ({len(extra)} unexpected)")


def _copy(param: Tensor, value: Tensor) -> None:
    with torch.no_grad():
        param.copy_(value)


def copy_linear(reader: StateDictReader, key: str, layer: nn.Linear) -> None:
    _copy(layer.weight, reader.get(f"{key}.weight", tuple(layer.weight.shape)))
    _copy(layer.bias, reader.get(f"{key}.bias", tuple(layer.bias.shape)))


def copy_conv(reader: StateDictReader, key: str, layer: nn.Conv1d) -> None:
    _copy(layer.weight, reader.get(f"{key}.weight", tuple(layer.weight.shape)))
    _copy(layer.bias, reader.get(f"{key}.bias", tuple(layer.bias.shape)))


def dit_config_from_state_dict(
    state: Mapping[str, Tensor],
    *,
    source: str = "flow.pt",
    prefix: str = ESTIMATOR_PREFIX,
    static_chunk_size: int = 50,
    num_decoding_left_chunks: int = -1,
) -> DiTConfig:
    """Infer the DiT sizes from tensor shapes (mu_dim is taken equal to mel_dim, as in every release)."""
    reader = StateDictReader(state, source)
    dim, in_dim = reader.shape(f"{prefix}input_embed.proj.weight")
    mel_dim = reader.shape(f"{prefix}proj_out.weight")[0]
    dim_head = 2 * reader.shape(f"{prefix}rotary_embed.inv_freq")[0]
    inner_dim = reader.shape(f"{prefix}transformer_blocks.0.attn.to_q.weight")[0]
    conv_out, conv_in_per_group, kernel = reader.shape(f"{prefix}input_embed.conv_pos_embed.conv1.0.weight")
    block_ids = {
        int(m.group(1))
        for k in state
        if (m := re.match(rf"{re.escape(prefix)}transformer_blocks\.(\d+)\.", k))
    }
    depth = max(block_ids) + 1
    if inner_dim % dim_head or block_ids != set(range(depth)) or conv_out != dim:
        raise FlowCheckpointError(f"{source}: inconsistent DiT shapes (blocks {sorted(block_ids)})")
    return DiTConfig(
        dim=dim,
        depth=depth,
        heads=inner_dim // dim_head,
        dim_head=dim_head,
        ff_dim=reader.shape(f"{prefix}transformer_blocks.0.ff.ff.0.0.weight")[0],
        mel_dim=mel_dim,
        mu_dim=mel_dim,
        spk_dim=in_dim - 3 * mel_dim,
        freq_embed_dim=reader.shape(f"{prefix}time_embed.time_mlp.0.weight")[1],
        conv_kernel=kernel,
        conv_groups=dim // conv_in_per_group,
        static_chunk_size=static_chunk_size,
        num_decoding_left_chunks=num_decoding_left_chunks,
    )


def load_dit_weights(dit: DiT, reader: StateDictReader, prefix: str = ESTIMATOR_PREFIX) -> None:
    """Fill ``dit`` from official keys under ``prefix``."""
    cfg = dit.cfg
    copy_linear(reader, f"{prefix}time_embed.time_mlp.0", dit.time_mlp1)
    copy_linear(reader, f"{prefix}time_embed.time_mlp.2", dit.time_mlp2)
    copy_linear(reader, f"{prefix}input_embed.proj", dit.input_proj)
    copy_conv(reader, f"{prefix}input_embed.conv_pos_embed.conv1.0", dit.conv_pos.conv1)
    copy_conv(reader, f"{prefix}input_embed.conv_pos_embed.conv2.0", dit.conv_pos.conv2)
    dit.set_inv_freq(reader.get(f"{prefix}rotary_embed.inv_freq", (cfg.dim_head // 2,)))
    copy_linear(reader, f"{prefix}proj_out", dit.proj_out)

    mod_w, mod_b = [], []
    for i, block in enumerate(dit.blocks):
        key = f"{prefix}transformer_blocks.{i}"
        mod_w.append(reader.get(f"{key}.attn_norm.linear.weight", (6 * cfg.dim, cfg.dim)))
        mod_b.append(reader.get(f"{key}.attn_norm.linear.bias", (6 * cfg.dim,)))
        qkv_w = [reader.get(f"{key}.attn.to_{n}.weight", (cfg.inner_dim, cfg.dim)) for n in "qkv"]
        qkv_b = [reader.get(f"{key}.attn.to_{n}.bias", (cfg.inner_dim,)) for n in "qkv"]
        _copy(block.attn.qkv.weight, torch.cat(qkv_w, dim=0))  # [3 * inner, D]
        _copy(block.attn.qkv.bias, torch.cat(qkv_b, dim=0))  # [3 * inner]
        copy_linear(reader, f"{key}.attn.to_out.0", block.attn.out)
        copy_linear(reader, f"{key}.ff.ff.0.0", block.ff1)
        copy_linear(reader, f"{key}.ff.ff.2", block.ff2)
    mod_w.append(reader.get(f"{prefix}norm_out.linear.weight", (2 * cfg.dim, cfg.dim)))
    mod_b.append(reader.get(f"{prefix}norm_out.linear.bias", (2 * cfg.dim,)))
    _copy(dit.modulation.weight, torch.cat(mod_w, dim=0))  # [(6 * depth + 2) * D, D]
    _copy(dit.modulation.bias, torch.cat(mod_b, dim=0))  # [(6 * depth + 2) * D]
