"""The speech LM's decode step with grouped-query attention read in place vs copied per query head.

    python scripts/bench_llm_decode.py [--preset full] [--batch 1,16] [--kv-len 400] [--repeats 20]
                                       [--device cpu] [--dtype float32] [--threads 1]

Random weights with the real architecture (``scripts.make_tiny_model``; ``full``: Fun-CosyVoice3-0.5B's
Qwen2, 14 query heads over 2 kv heads). Each batch size runs one decode step (one token per row after
``--kv-len`` cached positions) with the attention as it is now (``Qwen2Attention.forward``: the query
heads of a kv head side by side, the keys and values read once) and as it was before issue 25
(``expanded_attention_forward`` below: the keys and values copied to every query head, 7x their size
for the 0.5B model, every layer, every step), interleaved, best of ``--repeats``, and prints both times
and their ratio. The two agree within float rounding (tests/test_qwen2_gqa.py).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cosyvoice.llm import LLMRunner  # noqa: E402
from cosyvoice.llm.qwen2 import Qwen2Attention, _StepPlan, apply_rope  # noqa: E402
from cosyvoice.model import CosyVoice3  # noqa: E402
from scripts.make_tiny_model import bench_model_dir  # noqa: E402


def expanded_attention_forward(
    self: Qwen2Attention,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    plan: _StepPlan,
) -> torch.Tensor:
    """``Qwen2Attention.forward`` before issue 25: the cached keys and values expanded to every query head
    and copied (``reshape`` of an expanded view) before attention. The reference of the grouped one."""
    b, t, _ = x.shape
    q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
    k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
    v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    cache_k[plan.slots[:, None], :, plan.write_pos] = k.transpose(1, 2).to(cache_k.dtype)
    cache_v[plan.slots[:, None], :, plan.write_pos] = v.to(cache_v.dtype)
    keys = cache_k[plan.slots, :, : plan.kv_len]
    values = cache_v[plan.slots, :, : plan.kv_len]
    groups = self.num_heads // self.num_kv_heads
    if groups > 1:
        shape = (b, self.num_kv_heads, groups, plan.kv_len, self.head_dim)
        keys = keys[:, :, None].expand(shape).reshape(b, self.num_heads, plan.kv_len, self.head_dim)
        values = values[:, :, None].expand(shape).reshape(b, self.num_heads, plan.kv_len, self.head_dim)
    out = F.scaled_dot_product_attention(
        q, keys.to(q.dtype), values.to(q.dtype), attn_mask=plan.mask, scale=1.0 / math.sqrt(self.head_dim)
    )
    return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


@contextlib.contextmanager
def expanded_attention() -> Iterator[None]:
    """Every ``Qwen2Attention`` runs the copying forward of before while inside."""
    grouped = Qwen2Attention.forward
    Qwen2Attention.forward = expanded_attention_forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        Qwen2Attention.forward = grouped  # type: ignore[method-assign]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=("tiny", "full"), default="full")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--batch", default="1,16", help="comma-separated decode batch sizes")
    parser.add_argument("--kv-len", type=int, default=400, help="cached positions per row before the step")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per implementation (best kept)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_step(runner: LLMRunner, batch: int, kv_len: int, repeats: int) -> dict[str, float]:
    """Best decode-step seconds of each implementation on ``batch`` rows holding ``kv_len`` positions."""
    model = runner.model
    cache = runner.cache
    device = model.speech_embedding.weight.device
    slots = [cache.allocate() for _ in range(batch)]
    try:
        hidden = model.model.config.hidden_size
        prefix = torch.randn(batch, kv_len, hidden, generator=torch.Generator().manual_seed(0))
        model.model(prefix.to(device, model.speech_embedding.weight.dtype), cache, slots)  # fill the cache
        token = torch.zeros(batch, dtype=torch.long, device=device)
        best = {"grouped": math.inf, "expanded": math.inf}
        for _ in range(repeats):
            for name in ("expanded", "grouped"):
                for slot in slots:
                    cache._set_length(slot, kv_len)  # every step decodes at the same position
                context = expanded_attention() if name == "expanded" else contextlib.nullcontext()
                with context:
                    embeds = model.speech_embedding(token)[:, None]
                    _sync(device)
                    start = time.perf_counter()
                    model.speech_logp(model.model(embeds, cache, slots)[:, 0])
                    _sync(device)
                    best[name] = min(best[name], time.perf_counter() - start)
        return best
    finally:
        for slot in slots:
            cache.free(slot)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(n) for n in args.batch.split(",") if n.strip()]
    device = torch.device(args.device)
    model = CosyVoice3.from_pretrained(
        bench_model_dir(args.preset, model_dir=args.model_dir), device=device, dtype=getattr(torch, args.dtype)
    )
    config = model.llm.model.config
    runner = LLMRunner(model.llm, max_batch=max(batches), max_len=args.kv_len + 2)
    print(
        f"preset={args.preset} device={args.device} dtype={args.dtype} threads={torch.get_num_threads()} "
        f"layers={config.num_hidden_layers} heads={config.num_attention_heads} kv_heads={config.num_key_value_heads} "
        f"kv_len={args.kv_len} repeats={args.repeats} (best of, interleaved)"
    )
    print(f"{'batch':>5} {'expanded_ms':>12} {'grouped_ms':>11} {'expanded/grouped':>17}")
    for batch in batches:
        best = time_step(runner, batch, args.kv_len, args.repeats)
        ratio = best["expanded"] / best["grouped"]
        print(f"{batch:>5} {1000 * best['expanded']:>12.2f} {1000 * best['grouped']:>11.2f} {ratio:>16.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
