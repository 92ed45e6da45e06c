"""``scripts/bench_engine.py --arrivals poisson``: the engine under replies arriving at random moments.

The lone-stream first chunk, the engine's capacity, then one run per load (scripts/bench_traffic.py has
the replies, their arrivals and the gateway's way of playing them; bench_engine.py's docstring says
what each column is). One engine serves the whole run, so its caches are as warm as a server's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from scripts.bench_traffic import (
    EN_SENTENCES,
    RATE_SEED_OFFSET,
    ZH_SENTENCES,
    LoadResult,
    Reply,
    SentenceRecord,
    make_replies,
    play_reply,
    poisson_arrivals,
    table_header,
    table_row,
    tokens_for,
)
from tts_engine import TTSEngine
from tts_engine.backends.cosyvoice.timeline import Timeline, explain

REPO_ROOT = Path(__file__).resolve().parents[1]
# The reference sentences, alone one at a time (72-163 tokens each, both languages): 12, as the median of 6
# moved by up to 1.6x between runs on the same CPU (88-139 ms) and every goal is a ratio over it.
LONE_TEXTS = tuple(
    corpus[k] for k in (2, 7, 10, 3, 4, 9) for corpus in (ZH_SENTENCES, EN_SENTENCES)
)
GOALS = {0.6: 2.0, 0.9: 3.0}  # issue 25: sentence first-chunk p95 at most this times the lone first chunk


def git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (with uncommitted changes)" if dirty else "")


def explain_slowest(result: LoadResult, timeline: Timeline, count: int) -> list[str]:
    """Where the ``count`` slowest sentence first chunks of a load waited (``timeline.explain``)."""
    records = [r for r in result.records if r.first_chunk_s is not None and r.arrived_at is not None]
    records.sort(key=lambda r: -(r.first_chunk_s or 0.0))
    lines: list[str] = []
    for record in records[:count]:
        assert record.arrived_at is not None
        summary, *calls = explain(timeline, record.requested_at, record.arrived_at)
        lines.append(f"  slow first chunk (reply {record.reply}, sentence {record.index + 1}): {summary}")
        lines.extend("  " + call for call in calls)
    return lines


def stat_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    return {
        key: float(after[key]) - float(before.get(key, 0))
        for key, value in after.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


async def lone_first_chunk(engine: TTSEngine, voices: list[str], rate: int, count: int = len(LONE_TEXTS)) -> float:
    """The median first chunk of single sentences (the first ``count`` of ``LONE_TEXTS``), one at a time
    on an idle engine (the reference)."""
    firsts = []
    for k, text in enumerate(LONE_TEXTS[:count]):
        # Unpaced: a lone sentence's first chunk does not depend on how fast its listener reads the rest,
        # and a paced one would spend its whole audio length here (a GPU report's step has 150 s in all).
        reply = Reply("-", (text,))
        [record] = await play_reply(engine, reply, -1, voice=voices[k % len(voices)], rate=rate, paced=False)
        assert record.first_chunk_s is not None, record.error
        firsts.append(record.first_chunk_s)
    return statistics.median(firsts)


async def capacity(engine: TTSEngine, streams: int, voices: list[str], rate: int, seed: int) -> float:
    """Audio seconds per second with ``streams`` replies always in flight, consumers unpaced."""
    replies = make_replies(3 * streams, seed)
    pending = list(enumerate(replies))
    audio = 0.0

    async def worker() -> None:
        nonlocal audio
        while pending:
            number, reply = pending.pop(0)
            records = await play_reply(
                engine, reply, number, voice=voices[number % len(voices)], rate=rate, paced=False
            )
            audio += sum(r.audio_s for r in records)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(streams):
            group.create_task(worker())
    return audio / (time.perf_counter() - start)


async def one_load(
    engine: TTSEngine, load: float, replies: list[Reply], arrivals: list[float], voices: list[str], rate: int
) -> LoadResult:
    records: list[SentenceRecord] = []

    async def arrive(number: int, reply: Reply, at: float) -> None:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        records.extend(await play_reply(engine, reply, number, voice=voices[number % len(voices)], rate=rate))

    before = engine.stats
    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for number, (reply, at) in enumerate(zip(replies, arrivals, strict=True)):
            group.create_task(arrive(number, reply, at))
    wall = time.perf_counter() - start
    return LoadResult(load, records, wall, stat_delta(before, engine.stats))


async def run_poisson(args: argparse.Namespace, model: Any, make_backend: Callable[..., Any]) -> None:
    loads = [float(x) for x in args.load.split(",") if x.strip()]
    streams = int(args.streams.split(",")[-1])
    print(
        f"commit={git_commit()} preset={args.preset} device={args.device} dtype={args.dtype} "
        f"threads={torch.get_num_threads()} streams(KV slots)={streams} max_hop_rows={args.max_hop_rows} "
        f"flow_cache={args.flow_cache} final_pass={args.final_pass} step_order={args.step_order} "
        f"cuda_graphs={args.cuda_graphs} torch_compile={args.torch_compile} prompt={args.prompt_seconds}s "
        f"voices={args.voices} rate={args.rate} replies/load={args.replies} seed={args.seed} loads={args.load}"
        f" rows_cost={args.rows_cost} lone={args.lone}"
        f"{f' explain={args.explain} (calls timed, synchronised on a GPU)' if args.explain else ''}",
        flush=True,
    )
    voices = [f"bench{i}" for i in range(args.voices)]
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        backend = make_backend(
            model, args, streams, Path(tmp), args.voices, flow_cache=args.flow_cache != "off", tokens=tokens_for
        )
        if args.rows_cost != "auto":  # the engine's choice by device, overridden for a before / after
            backend.stepper.set_rows_cost(args.rows_cost == "on")
        timeline = None
        if args.explain > 0:
            sync = torch.cuda.synchronize if torch.device(args.device).type == "cuda" else None
            timeline = backend.stepper.timeline = Timeline(sync)
        engine = TTSEngine(backend, max_queue_wait_s=None, max_pending_requests=4096)
        await engine.start()
        try:
            warm_up = Reply("-", (ZH_SENTENCES[3],))
            await play_reply(engine, warm_up, -1, voice=voices[0], rate=args.rate, paced=False)
            print(f"warm-up done ({time.perf_counter() - began:.0f} s since the start)", flush=True)
            lone = await lone_first_chunk(engine, voices, args.rate, args.lone_sentences)
            print(
                f"lone-stream first chunk: {1000 * lone:.0f} ms (median of {args.lone_sentences} sentences alone; "
                f"{time.perf_counter() - began:.0f} s since the start)",
                flush=True,
            )
            if args.capacity is None:
                cap = await capacity(engine, streams, voices, args.rate, args.seed + 7)
                print(
                    f"capacity: {cap:.2f} audio s/s ({streams} replies in flight, consumers unpaced; "
                    f"{time.perf_counter() - began:.0f} s since the start)",
                    flush=True,
                )
            else:  # given: two runs (e.g. two step orders) offer the same load on a machine whose speed drifts
                cap = args.capacity
                print(f"capacity: {cap:.2f} audio s/s (given with --capacity, not measured)", flush=True)
            before = lone  # with --lone bracket: the lone first chunk measured right before the next load
            if args.lone == "bracket" and args.capacity is None and loads:
                before = await lone_first_chunk(engine, voices, args.rate, args.lone_sentences)  # after the capacity run
                print(f"lone-stream first chunk again after the capacity run: {1000 * before:.0f} ms", flush=True)
            print(table_header())
            rows = {}
            for k, load in enumerate(loads):
                replies = make_replies(args.replies, args.seed + k)
                rate = load * cap / statistics.fmean(r.audio_s for r in replies)
                arrivals = poisson_arrivals(len(replies), rate, args.seed + RATE_SEED_OFFSET + k)
                result = await one_load(engine, load, replies, arrivals, voices, args.rate)
                reference, bracket = lone, ""
                if args.lone == "bracket":  # this load's own minutes: the machine's speed drifts
                    after = await lone_first_chunk(engine, voices, args.rate, args.lone_sentences)
                    reference = (before + after) / 2
                    bracket = (
                        f"  lone first chunk right before / after this load: {1000 * before:.0f} / "
                        f"{1000 * after:.0f} ms (lone_ms: their mean)"
                    )
                    before = after
                rows[load] = result.row(reference)
                print("\n".join(filter(None, (table_row(rows[load]), bracket))), flush=True)
                if timeline is not None:
                    print("\n".join(explain_slowest(result, timeline, args.explain)), flush=True)
        finally:
            await engine.close()
    for load, limit in GOALS.items():
        row = rows.get(load)
        if row is not None:
            met = row["p95_x_lone"] <= limit and (load > 0.6 or row["underruns"] == 0)
            print(
                f"load {load}: sentence first-chunk p95 = {row['p95_x_lone']:.2f}x the lone first chunk "
                f"(goal <= {limit}x), mid-stream underruns {row['underruns']:.0f}"
                f"{' (goal 0)' if load <= 0.6 else ''}: {'met' if met else 'NOT met'}"
            )
