"""Speech-token sampling of a decode batch: row by row (``ras_sample``) against all rows at once
(``ras_sample_rows``, what ``LLMRunner`` runs), on the CosyVoice3 vocabulary (6761 ids).

    python scripts/bench_sampling.py --batch 1,4,16 --threads 1

Both draw the same ids from the same generators (tests/test_cosy_sampling.py checks it); this prints the
milliseconds per batch of each, interleaved, best of ``--repeats``, and their ratio, in one run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from cosyvoice.llm.sampling import RasParams, make_generator, ras_sample, ras_sample_rows

VOCAB = 6761  # speech tokens + stop ids of CosyVoice3's LLM head
PARAMS = RasParams()


def by_rows(logp: torch.Tensor, histories: list[list[int]], generators: list[torch.Generator]) -> None:
    for row, history, generator in zip(logp, histories, generators, strict=True):
        ras_sample(row, history, generator, PARAMS)


def at_once(logp: torch.Tensor, histories: list[list[int]], generators: list[torch.Generator]) -> None:
    ras_sample_rows(logp, histories, generators, PARAMS)


def timed(draw: Callable[..., None], logp: torch.Tensor, steps: int) -> float:
    """Seconds per batch over ``steps`` batches of ``draw`` (fresh histories, one generator a row)."""
    histories: list[list[int]] = [[] for _ in range(logp.shape[0])]
    generators = [make_generator(k) for k in range(logp.shape[0])]
    started = time.perf_counter()
    for _ in range(steps):
        draw(logp, histories, generators)
    return (time.perf_counter() - started) / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,4,16", help="comma-separated decode batch sizes")
    parser.add_argument("--steps", type=int, default=200, help="batches per timing")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timings of each (best kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"vocab={VOCAB} threads={torch.get_num_threads()} steps={args.steps} repeats={args.repeats} torch={torch.__version__}")
    print(f"{'batch':>5} {'rows_ms':>8} {'batch_ms':>8} {'ratio':>6}")
    for batch in (int(b) for b in args.batch.split(",")):
        # a trained LM's rows are peaked: logits spread over a few units, most ids far below the head
        logp = (torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(batch)) * 3).log_softmax(-1)
        best = {"rows": float("inf"), "batch": float("inf")}
        for _ in range(args.repeats):
            best["rows"] = min(best["rows"], timed(by_rows, logp, args.steps))
            best["batch"] = min(best["batch"], timed(at_once, logp, args.steps))
        ratio = best["rows"] / best["batch"]
        print(f"{batch:>5} {1000 * best['rows']:>8.3f} {1000 * best['batch']:>8.3f} {ratio:>5.2f}x")


if __name__ == "__main__":
    main()
