"""The floor under issue 25's first-audio goal: the sentence first-chunk p95 a perfect scheduler would reach
on one engine thread, under the Poisson bench's own traffic.

    python scripts/first_audio_floor.py [--load 0.3,0.6,0.9] [--capacity 14.9] [--lone-ms 80]
                                        [--opening-calls-ms 47,78,,136] [--llm-scale 1] [--replies 20000]
                                        [--seed 0] [--busy-pct 52.1 --unit-ms 20,40]

A model, not a timing: the replies, their sizes and their Poisson arrivals are drawn as
``scripts/bench_engine.py --arrivals poisson`` draws them (``scripts/bench_traffic.py``), and sentence
k + 1 of a reply is requested when sentence k's first chunk arrives, as the bench's listener asks for it.
Each sentence's first audio costs the engine one opening: its LLM part (prefill and a burst to the first
hop's tokens; ``--lone-ms`` less one opening's flow call) and its flow + vocoder call. The engine here
is a perfect scheduler for first audio: an opening never waits for anything but other openings (every
hop, closing pass and playing stream's decode is paused at no cost the instant a request arrives), the
openings waiting when the engine is free run together, oldest first, up to as many as
``--opening-calls-ms`` lists (one shared burst, the LLM part paid once, or with ``--llm-scale`` that
many times: a CPU's batched decode step costs more for more rows; the flow call at the listed cost), and
requests that arrive meanwhile wait for the next call. What it prints per load is what no
real single-threaded engine can beat under that traffic; a real one adds what it cannot pause (a flow
call or slice under way when a request arrives, a burst, a stream that would run dry).

Defaults are the figures of docs/step-order.md: the lone first chunk of run 46 (80 ms, tiny preset, one
CPU thread) and the calls of one, two and four openings measured for ``openings_per_call`` (47, 78 and
136 ms; three interpolated). The result in multiples of the lone first chunk depends on their ratios,
not on the machine's speed.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_traffic import (
    RATE_SEED_OFFSET,
    make_replies,
    mean_reply_audio_s,
    percentile,
    poisson_arrivals,
)

# flow + vocoder of 1, 2 and 4 first hops in one call (docs/step-order.md item 2)
OPENING_CALLS_MS = "47,78,,136"
LONE_MS = 80.0  # run 46's lone first chunk (docs/step-order.md)


@dataclass(frozen=True)
class Floor:
    """One load's sentences under the perfect scheduler."""

    first_chunk_s: list[float]  # every sentence's first chunk (request to audio), in request order
    busy_s: float  # engine time spent on openings
    wall_s: float  # first request to last first chunk

    def share(self) -> float:
        """The engine's share spent on first audio alone."""
        return self.busy_s / self.wall_s if self.wall_s > 0 else 0.0


def simulate(
    arrivals: Sequence[float],
    sentences: Sequence[int],
    call_s: Callable[[int], float],
    batch: int,
    *,
    other: float = 0.0,
    unit_s: float = 0.0,
    seed: int = 0,
) -> Floor:
    """Reply r arrives at ``arrivals[r]`` with ``sentences[r]`` sentences; its next sentence is requested
    when the one before has its first chunk. A call of k waiting openings (oldest first, k <= ``batch``)
    costs ``call_s(k)`` seconds of the one engine; requests arriving during a call wait for the next.
    ``other``: the chance that a request arriving while no opening runs finds the engine in a unit of other
    work it cannot pause, ``unit_s`` long (so it waits for the rest of it: uniform in 0..``unit_s``)."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    if not 0 <= other <= 1 or unit_s < 0:
        raise ValueError(f"other must be in 0..1 and unit_s at least 0, got {other} and {unit_s}")
    if len(arrivals) != len(sentences) or any(n < 1 for n in sentences):
        raise ValueError("every reply needs an arrival and at least one sentence")
    rng = random.Random(seed)
    # (requested at, reply, index in it): the openings not run yet, the oldest first
    pending: list[tuple[float, int, int]] = [(at, r, 0) for r, at in enumerate(arrivals)]
    heapq.heapify(pending)
    firsts: list[tuple[float, float]] = []  # (requested, first chunk)
    free = busy = 0.0
    while pending:
        start = max(free, pending[0][0])
        if pending[0][0] >= free and other and rng.random() < other:  # it came while other work ran
            start += rng.uniform(0.0, unit_s)
        call: list[tuple[float, int, int]] = []
        while pending and pending[0][0] <= start and len(call) < batch:
            call.append(heapq.heappop(pending))
        cost = call_s(len(call))
        busy += cost
        free = start + cost
        for requested, reply, index in call:
            firsts.append((requested, free - requested))
            if index + 1 < sentences[reply]:
                heapq.heappush(pending, (free, reply, index + 1))  # asked for as this one starts to play
    firsts.sort()
    wall = max(at + s for at, s in firsts) - min(at for at, _ in firsts)
    return Floor([s for _, s in firsts], busy, wall)


def md1_response_quantile(rate: float, service_s: float, q: float) -> float:
    """The ``q`` quantile (0-1) of the response time (wait + service) of an M/D/1 FIFO queue, from Erlang's
    waiting-time distribution P(W <= t) = (1 - rho) sum_{k=0}^{floor(t/D)} (lam (kD - t))^k / k! e^{-lam (kD - t)}
    (the check of ``simulate``)."""
    rho = rate * service_s
    if not 0 < rho < 1:
        raise ValueError(f"the queue is stable only for 0 < rho < 1, got {rho:.3f}")

    def cdf(t: float) -> float:
        total = 0.0
        for k in range(int(t / service_s) + 1):
            x = rate * (k * service_s - t)
            total += x**k / math.factorial(k) * math.exp(-x)
        return (1 - rho) * total

    if cdf(0.0) >= q:
        return service_s
    low, high = 0.0, service_s
    while cdf(high) < q:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < q else (low, middle)
    return high + service_s


def opening_calls(text: str, unit: float = 1000) -> list[float]:
    """``"47,78,,136"`` -> seconds of calls of 1..n openings (each value over ``unit``), blanks interpolated
    linearly between neighbours."""
    items = [item.strip() for item in text.split(",")]
    if not items or not items[0] or not items[-1]:
        raise ValueError(f"the first and last values must be given, got {text!r}")
    known = {k: float(item) / unit for k, item in enumerate(items) if item}
    if any(v <= 0 for v in known.values()):
        raise ValueError(f"the values must be positive, got {text!r}")
    keys = sorted(known)
    costs = []
    for k in range(len(items)):
        if k in known:
            costs.append(known[k])
            continue
        below = max(i for i in keys if i < k)
        above = min(i for i in keys if i > k)
        costs.append(known[below] + (known[above] - known[below]) * (k - below) / (above - below))
    return costs


def floor_at(
    load: float,
    capacity: float,
    lone_s: float,
    calls: list[float],
    replies: int,
    seed: int,
    k: int,
    *,
    other: float = 0.0,
    unit_s: float = 0.0,
    llm_scale: list[float] | None = None,
) -> Floor:
    """The bench's load ``k`` (replies from ``seed + k``, arrivals at ``load`` of ``capacity``) on the perfect
    scheduler: a call of n openings costs the LLM part once (times ``llm_scale[n - 1]``: a batched decode
    of n rows over one row's; the last factor for more rows) plus ``calls[n - 1]`` (``other``, ``unit_s``:
    see ``simulate``)."""
    drawn = make_replies(replies, seed + k)
    rate = load * capacity / statistics.fmean(r.audio_s for r in drawn)
    arrivals = poisson_arrivals(len(drawn), rate, seed + RATE_SEED_OFFSET + k)
    llm_s = lone_s - calls[0]
    scale = llm_scale or [1.0]
    return simulate(
        arrivals,
        [len(r.sentences) for r in drawn],
        lambda n: llm_s * scale[min(n, len(scale)) - 1] + calls[n - 1],
        len(calls),
        other=other,
        unit_s=unit_s,
        seed=seed + k,
    )


def other_share(busy: float, openings: float) -> float:
    """The chance that a request arriving while no opening runs finds other work running: the engine's busy
    share less its openings' share, over the time the openings leave (0 when they take it all)."""
    return 0.0 if openings >= 1 else min(1.0, max(0.0, (busy - openings) / (1 - openings)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", default="0.3,0.6,0.9", help="fractions of the capacity")
    parser.add_argument(
        "--capacity", type=float, default=14.9, help="audio s/s (run 46's; the ratios barely depend on it)"
    )
    parser.add_argument("--lone-ms", type=float, default=LONE_MS, help="the lone first chunk")
    parser.add_argument(
        "--opening-calls-ms",
        default=OPENING_CALLS_MS,
        help="flow + vocoder of a call of 1, 2, ... openings (blank: interpolated)",
    )
    parser.add_argument("--replies", type=int, default=20000, help="replies per load (the bench runs 60)")
    parser.add_argument("--seed", type=int, default=0, help="as the bench's --seed")
    parser.add_argument(
        "--busy-pct",
        default="",
        help="the engine's busy %% at each load, as the bench measured it: then also the p95 with the rest of "
        "that work run in units it cannot pause, --unit-ms long",
    )
    parser.add_argument("--unit-ms", default="10,20,40,80", help="with --busy-pct: lengths of those units")
    parser.add_argument(
        "--llm-scale",
        default="1",
        help="the LLM part of a call of 1, 2, ... openings over one opening's (a CPU's batched decode step "
        "costs more a row more: e.g. 1,1.26,1.42,1.62); blank: interpolated; 1: paid once a call",
    )
    args = parser.parse_args(argv)
    try:
        calls = opening_calls(args.opening_calls_ms)
        scale = opening_calls(args.llm_scale, unit=1)
        loads = [float(x) for x in args.load.split(",") if x.strip()]
        busy = [float(x) / 100 for x in args.busy_pct.split(",") if x.strip()]
        units = [float(x) / 1000 for x in args.unit_ms.split(",") if x.strip()] if busy else []
    except ValueError as exc:
        parser.error(str(exc))
    if busy and (len(busy) != len(loads) or any(not 0 < b <= 1 for b in busy) or any(u <= 0 for u in units)):
        parser.error("--busy-pct needs one share in 0..100 a load, and --unit-ms positive lengths")
    lone = args.lone_ms / 1000
    if not lone > calls[0]:
        parser.error(
            f"--lone-ms ({args.lone_ms}) must exceed one opening's call ({1000 * calls[0]:.0f} ms): it includes it"
        )
    if args.capacity <= 0 or args.replies < 1 or not loads or any(x <= 0 for x in loads):
        parser.error("--capacity, --replies and every load must be positive")
    if scale[0] != 1 or any(b < a for a, b in zip(scale, scale[1:], strict=False)):
        parser.error(f"--llm-scale must start at 1 and not fall, got {args.llm_scale!r}")
    print(
        f"perfect first-audio scheduler on one engine: lone {args.lone_ms:.0f} ms (LLM part {1000 * (lone - calls[0]):.0f} ms), "
        f"calls of 1..{len(calls)} openings {', '.join(f'{1000 * c:.0f}' for c in calls)} ms, "
        f"LLM part x {', '.join(f'{x:g}' for x in scale)}, capacity {args.capacity} s/s, "
        f"{args.replies} replies a load (mean {mean_reply_audio_s():.1f} s of audio), seed {args.seed}"
    )
    print(
        f"{'load':>5} {'sentences':>9} {'p50_x':>6} {'p95_x':>6} {'p99_x':>6} {'p95_x_one_a_call':>16} {'openings_share':>14}"
        + "".join(f" {f'p95_x_unit_{1000 * u:.0f}ms':>16}" for u in units)
    )
    for k, load in enumerate(loads):
        at = functools.partial(floor_at, load, args.capacity, lone, replies=args.replies, seed=args.seed, k=k)
        best = at(calls=calls, llm_scale=scale)
        alone = at(calls=calls[:1])
        ratio = [s / lone for s in best.first_chunk_s]
        other = other_share(busy[k], best.share()) if busy else 0.0
        with_units = [at(calls=calls, other=other, unit_s=unit, llm_scale=scale) for unit in units]
        print(
            f"{load:>5.2f} {len(ratio):>9} {percentile(ratio, 50):>6.2f} {percentile(ratio, 95):>6.2f} "
            f"{percentile(ratio, 99):>6.2f} {percentile([s / lone for s in alone.first_chunk_s], 95):>16.2f} "
            f"{100 * best.share():>13.1f}%"
            + "".join(f" {percentile([s / lone for s in f.first_chunk_s], 95):>16.2f}" for f in with_units),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
