"""Parity handler for the ``token2wav`` case kind (the official tts loop fed a complete token list)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cosyvoice.flow import Flow
from cosyvoice.token2wav import SpeakerPrompt, Token2Wav

from .hift import hift_model


def _token2wav(ctx: Any) -> Token2Wav:
    if "token2wav" not in ctx.cache:
        flow = ctx.cache.get("flow")  # the flow handlers' instance, when it sits on our device
        if flow is None or flow.input_embedding.weight.device != torch.device(ctx.device):
            flow = Flow.from_pretrained(ctx.model_dir).to(ctx.device)
        ctx.cache["token2wav"] = Token2Wav(flow, hift_model(ctx))
    return ctx.cache["token2wav"]


def token2wav(ctx: Any, case: dict, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model = _token2wav(ctx)
    prompt = SpeakerPrompt(
        prompt_token=inputs["prompt_token"][0],
        prompt_feat=inputs["prompt_feat"][0],
        embedding=inputs["embedding"][0],
    )
    stream = model.stream(prompt, stream=bool(case["params"]["stream"]))
    chunks = stream.push_tokens(inputs["token"][0]) + stream.finish()
    return {f"speech.{i}": chunk[None].cpu() for i, chunk in enumerate(chunks)}  # [1, n_i] each


HANDLERS: dict[str, Callable[[Any, dict, dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "token2wav": token2wav,
}
