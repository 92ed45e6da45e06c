"""Paired A/B of step settings on one engine under Poisson arrivals (the tiny preset on a CPU by default).

On a machine whose speed drifts by 1.5x within a minute, two ``bench_engine.py --arrivals poisson`` runs
one after the other compare the minutes more than the code. Here one engine serves every variant: each
round draws new replies and arrivals (the same for every variant of the round), each variant runs a few
unmeasured warm-up replies (its own recent steps for the engine's estimates) and then the round's
replies, and the variants take turns in alternating order. Per round and load it prints each variant's
sentence first-chunk p95, p50, mid-stream underruns and engine busy %; at the end the sentences of all
rounds pooled, and in how many rounds each variant had the lowest p95.

A variant is ``NAME=ATTR:VALUE[,ATTR:VALUE...]``: attributes of the backend's ``BatchedStep``
(tts_engine/backends/cosyvoice/step.py) that exist and hold a bool, int or float, e.g.
``--variant old=urgent_closing_pauses:false --variant new=urgent_closing_pauses:true``. ``rows_cost``
goes through ``set_rows_cost`` (it sets what follows from it too).

    python scripts/bench_engine_ab.py --capacity 11 --rounds 8 --replies 20 --load 0.6,0.9 \\
        --variant old=urgent_closing_pauses:false --variant new=urgent_closing_pauses:true
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_engine import _parse_args as engine_args
from scripts.bench_engine import load_model, make_backend
from scripts.bench_engine_poisson import (
    RATE_SEED_OFFSET,
    capacity,
    git_commit,
    lone_first_chunk,
    one_load,
)
from scripts.bench_traffic import (
    ZH_SENTENCES,
    Reply,
    make_replies,
    percentile,
    play_reply,
    poisson_arrivals,
    tokens_for,
)
from tts_engine import TTSEngine

WARM_SEED = 5000  # warm-up replies draw from this + the round's seed: never the measured ones


def parse_variant(text: str) -> tuple[str, dict[str, bool | int | float]]:
    """``NAME=ATTR:VALUE,...`` -> (name, settings); values true/false, an int or a float."""
    name, sep, body = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a variant is NAME=ATTR:VALUE[,ATTR:VALUE...], got {text!r}")
    settings: dict[str, bool | int | float] = {}
    for item in filter(None, body.split(",")):
        attr, sep, raw = item.partition(":")
        if not sep or not attr:
            raise argparse.ArgumentTypeError(f"variant {name!r}: {item!r} is not ATTR:VALUE")
        value: bool | int | float
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    raise argparse.ArgumentTypeError(f"variant {name!r}: {raw!r} is not true, false or a number") from None
        settings[attr] = value
    return name, settings


def apply(stepper: Any, settings: dict[str, bool | int | float]) -> None:
    for attr, value in settings.items():
        if attr == "rows_cost":
            stepper.set_rows_cost(bool(value))
        else:
            setattr(stepper, attr, value)


def check(stepper: Any, variants: list[tuple[str, dict[str, bool | int | float]]]) -> None:
    """Every attribute exists on the stepper and holds a value of the variant's kind (a typo is an error)."""
    for name, settings in variants:
        for attr, value in settings.items():
            current = getattr(stepper, attr, None)
            if attr != "rows_cost" and (current is None or type(current) not in (bool, int, float)):
                raise SystemExit(f"variant {name!r}: the step has no bool, int or float setting {attr!r}")
            if attr != "rows_cost" and isinstance(current, bool) != isinstance(value, bool):
                raise SystemExit(f"variant {name!r}: {attr} is a {type(current).__name__}, got {value!r}")


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", type=parse_variant, action="append", required=True, help="NAME=ATTR:VALUE,...")
    parser.add_argument("--rounds", type=int, default=8, help="rounds (new replies each; variants alternate order)")
    parser.add_argument("--replies", type=int, default=20, help="replies per round and load")
    parser.add_argument("--warm", type=int, default=6, help="unmeasured replies before each variant's run")
    parser.add_argument("--load", default="0.6,0.9", help="fractions of the capacity")
    parser.add_argument("--capacity", type=float, default=None, help="audio s/s taken as capacity (default: measured once)")
    parser.add_argument("--streams", type=int, default=16, help="KV slots")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0, help="round r draws replies from seed + 100 r + the load's index")
    parser.add_argument("--model-dir", type=Path, default=None, help="the tiny model's folder (made if missing)")
    args = parser.parse_args(argv)
    if len(args.variant) < 2 or len({name for name, _ in args.variant}) != len(args.variant):
        parser.error("give at least two --variant, each with its own name")
    if args.rounds < 1 or args.replies < 1 or args.warm < 0:
        parser.error("--rounds and --replies must be at least 1, --warm at least 0")
    return args


async def run(args: argparse.Namespace) -> None:
    loads = [float(x) for x in args.load.split(",") if x.strip()]
    model_dir = ["--model-dir", str(args.model_dir)] if args.model_dir else []
    engine_settings = engine_args(["--arrivals", "poisson", "--streams", str(args.streams), *model_dir])
    print(
        f"commit={git_commit()} threads={args.threads} streams={args.streams} rounds={args.rounds} "
        f"replies={args.replies} warm={args.warm} loads={args.load} seed={args.seed} "
        f"variants={' '.join(f'{n}={s}' for n, s in args.variant)}",
        flush=True,
    )
    model = load_model(engine_settings)
    voices = [f"bench{i}" for i in range(engine_settings.voices)]
    rate = engine_settings.rate
    pooled: dict[tuple[str, float], list[float]] = defaultdict(list)
    underruns: dict[tuple[str, float], int] = defaultdict(int)
    wins: dict[tuple[str, float], int] = defaultdict(int)
    with tempfile.TemporaryDirectory() as tmp:
        backend = make_backend(model, engine_settings, args.streams, Path(tmp), len(voices), tokens=tokens_for)
        check(backend.stepper, args.variant)
        engine = TTSEngine(backend, max_queue_wait_s=None, max_pending_requests=4096)
        await engine.start()
        try:
            await play_reply(engine, Reply("-", (ZH_SENTENCES[3],)), -1, voice=voices[0], rate=rate, paced=False)
            lone = await lone_first_chunk(engine, voices, rate)
            cap = args.capacity or await capacity(engine, args.streams, voices, rate, args.seed + 7)
            print(f"lone first chunk {1000 * lone:.0f} ms; capacity {cap:.2f} audio s/s", flush=True)
            for r in range(args.rounds):
                order = args.variant if r % 2 == 0 else args.variant[::-1]
                for k, load in enumerate(loads):
                    seed = args.seed + 100 * r + k
                    replies = make_replies(args.replies, seed)
                    per_s = load * cap / statistics.fmean(x.audio_s for x in replies)
                    arrivals = poisson_arrivals(len(replies), per_s, seed + RATE_SEED_OFFSET)
                    p95s: dict[str, float] = {}
                    for name, settings in order:
                        apply(backend.stepper, settings)
                        if args.warm:
                            warm = make_replies(args.warm, WARM_SEED + seed)
                            await one_load(engine, load, warm, poisson_arrivals(args.warm, per_s, WARM_SEED + seed), voices, rate)
                        row = (result := await one_load(engine, load, replies, arrivals, voices, rate)).row(lone)
                        pooled[name, load] += [x.first_chunk_s for x in result.records if x.first_chunk_s is not None]
                        underruns[name, load] += int(row["underruns"])
                        p95s[name] = row["first_p95_ms"]
                        print(
                            f"round {r} load {load} {name}: p95 {row['first_p95_ms']:.0f} ms p50 {row['first_p50_ms']:.0f} ms "
                            f"underruns {row['underruns']:.0f} busy {row['busy_pct']:.1f} %",
                            flush=True,
                        )
                    wins[min(p95s, key=p95s.__getitem__), load] += 1
        finally:
            await engine.close()
    for load in loads:
        for name, _ in args.variant:
            firsts = pooled[name, load]
            if not firsts:
                print(f"pooled load {load} {name}: no sentence had a first chunk")
                continue
            p95 = percentile(firsts, 95)
            print(
                f"pooled load {load} {name}: sentences {len(firsts)} p50 {1000 * percentile(firsts, 50):.0f} ms "
                f"p95 {1000 * p95:.0f} ms ({p95 / lone:.2f}x the lone) underruns {underruns[name, load]} "
                f"lowest p95 in {wins[name, load]} of {args.rounds} rounds"
            )


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
