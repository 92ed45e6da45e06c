"""Grouped-query attention read in the grouped layout (cosyvoice/llm/qwen2.py) equals the copying version
of before (scripts/bench_llm_decode.py keeps it as the reference), for prefill and decode steps."""

from __future__ import annotations

import pytest
import torch

from cosyvoice.llm.qwen2 import Qwen2Config, Qwen2Model
from scripts.bench_llm_decode import expanded_attention


@pytest.mark.parametrize("heads, kv_heads", [(14, 2), (4, 2), (4, 4)])
def test_grouped_attention_equals_the_expanded_copy(heads: int, kv_heads: int) -> None:
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=8 * heads, intermediate_size=64, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=32,
    )  # fmt: skip
    model = Qwen2Model(config).eval()
    prefix = torch.randn(3, 7, config.hidden_size)
    steps = [torch.randn(3, 1, config.hidden_size) for _ in range(4)]
    outputs = {}
    for name in ("grouped", "expanded"):
        cache = model.new_cache(max_batch=4, max_len=32)
        slots = [cache.allocate() for _ in range(3)]
        with torch.inference_mode(), expanded_attention() if name == "expanded" else torch.no_grad():
            got = [model(prefix, cache, slots, lengths=[7, 4, 5])]  # right-padded prefill rows
            got += [model(step, cache, slots) for step in steps]  # decode steps at different lengths
        outputs[name] = got
    for grouped, expanded in zip(outputs["grouped"], outputs["expanded"], strict=True):
        torch.testing.assert_close(grouped, expanded, rtol=1e-5, atol=1e-5)
