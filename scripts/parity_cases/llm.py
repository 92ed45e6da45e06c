"""Parity handlers for the ``llm_forward`` and ``llm_sampling`` case kinds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cosyvoice.llm import CosyVoice3LM, LengthRule, LLMPrompt, LLMRequest, generate
from cosyvoice.llm.sampling import RasParams
from cosyvoice.pretrained import load_llm


def _model(ctx: Any) -> CosyVoice3LM:
    if "llm" not in ctx.cache:
        ctx.cache["llm"] = load_llm(ctx.model_dir)
    return ctx.cache["llm"]


def _prompt(inputs: dict[str, torch.Tensor]) -> LLMPrompt:
    return LLMPrompt.create(inputs["text"], inputs["prompt_text"], inputs["prompt_speech_token"])


def llm_forward(ctx: Any, case: dict, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    logp = _model(ctx).forward_logp(_prompt(inputs), inputs["target_speech_token"])  # [T + 1, 6761]
    return {"logp": logp.float().cpu()}


def llm_sampling(ctx: Any, case: dict, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    params = case["params"]
    request = LLMRequest(
        _prompt(inputs),
        seed=int(params["seed"]),
        ras=RasParams(
            top_p=params["top_p"], top_k=params["top_k"], win_size=params["win_size"], tau_r=params["tau_r"]
        ),
        lengths=LengthRule(
            min_token_text_ratio=params["min_token_text_ratio"],
            max_token_text_ratio=params["max_token_text_ratio"],
        ),
    )
    tokens = list(generate(_model(ctx), request))
    return {"speech_token": torch.tensor([tokens], dtype=torch.int32)}  # [1, n]


HANDLERS: dict[str, Callable[[Any, dict, dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "llm_forward": llm_forward,
    "llm_sampling": llm_sampling,
}
