"""Parity handlers for the ``flow_inference`` and ``flow_stream`` case kinds."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from cosyvoice.flow import Flow
from cosyvoice.pretrained import load_flow

FIRST_HOP = 25  # tokens; must equal the DiT chunk (50 frames) / token_mel_ratio
MAX_HOP = 100
HOP_SCALE = 2


def _flow(ctx: Any) -> Flow:
    if "flow" not in ctx.cache:
        ctx.cache["flow"] = load_flow(ctx.config, device=ctx.device)
    return ctx.cache["flow"]


def _run(flow: Flow, inputs: dict[str, torch.Tensor], n_tokens: int, **kwargs: Any) -> torch.Tensor:
    token, prompt_token, prompt_feat = (
        inputs["token"][:, :n_tokens],
        inputs["prompt_token"],
        inputs["prompt_feat"],
    )
    return flow.inference(
        token,
        [token.shape[1]],
        prompt_token,
        [prompt_token.shape[1]],
        prompt_feat,
        [prompt_feat.shape[1]],
        inputs["embedding"],
        **kwargs,
    )  # [1, 80, M]


def flow_inference(ctx: Any, case: dict, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    params = case["params"]
    mel = _run(
        _flow(ctx),
        inputs,
        inputs["token"].shape[1],
        streaming=bool(params["streaming"]),
        finalize=bool(params["finalize"]),
        n_timesteps=int(params["n_timesteps"]),
        cfg_rate=float(params["inference_cfg_rate"]),
    )
    return {"mel": mel.cpu()}


def stream_schedule(n_prompt: int, n_tokens: int, lookahead: int) -> list[tuple[int, bool, bool, int]]:
    """Official fresh-state hops over a complete token list: (tokens passed, streaming, finalize, offset)."""
    hop = FIRST_HOP
    this_hop = hop + math.ceil(n_prompt / hop) * hop - n_prompt
    offset, calls = 0, []
    while n_tokens - offset >= this_hop + lookahead:
        calls.append((offset + this_hop + lookahead, True, False, offset))
        offset += this_hop
        hop = min(MAX_HOP, HOP_SCALE * hop)
        this_hop = hop
    calls.append((n_tokens, False, True, offset))
    return calls


def flow_stream(ctx: Any, case: dict, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    flow = _flow(ctx)
    calls = stream_schedule(
        inputs["prompt_token"].shape[1], inputs["token"].shape[1], flow.cfg.pre_lookahead_len
    )
    out: dict[str, torch.Tensor] = {}
    for i, (n_tokens, streaming, finalize, offset) in enumerate(calls):
        mel = _run(flow, inputs, n_tokens, streaming=streaming, finalize=finalize)  # [1, 80, M]
        out[f"mel.{i}"] = mel[:, :, flow.cfg.token_mel_ratio * offset :].cpu()
    out["schedule"] = torch.tensor(
        [[n, int(s), int(f), o] for n, s, f, o in calls], dtype=torch.int32
    )  # [n, 4]
    return out


HANDLERS: dict[str, Callable[[Any, dict, dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "flow_inference": flow_inference,
    "flow_stream": flow_stream,
}
