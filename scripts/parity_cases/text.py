"""Parity handlers for the ``tokenize`` and ``tokenizer_specials`` case kinds."""

from __future__ import annotations

import torch
from torch import Tensor

from scripts.parity_cases import Handler, ParityContext


def tokenize(ctx: ParityContext, case: dict, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    text = bytes(inputs["text_utf8"].to(torch.uint8).tolist()).decode("utf-8")
    ids = ctx.tokenizer.encode(text)
    return {"ids": torch.tensor([ids], dtype=torch.int32)}  # [1, n]


def tokenizer_specials(ctx: ParityContext, case: dict, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    ids = ctx.tokenizer.convert_tokens_to_ids(case["params"]["tokens"])
    return {"ids": torch.tensor(ids, dtype=torch.int32)}  # [n_tokens]


HANDLERS: dict[str, Handler] = {"tokenize": tokenize, "tokenizer_specials": tokenizer_specials}
