"""``scripts/bench_gateway.py --arrivals poisson``: device turns arriving as a Poisson process.

    python scripts/bench_gateway.py --arrivals poisson --backend gpu-sim --load 0.3,0.6,0.9 [--replies 60]

The engine benchmark's traffic (scripts/bench_traffic.py: Chinese and English replies of 1-6 sentences,
fixed seed) played through the whole gateway: each reply is one typed turn of its own simulated device
(the echo LLM says the reply's sentences back, prefixed), the gateway segments, synthesises with one
sentence of look-ahead and paces 60 ms Opus frames to the device, which plays them in real time.

Capacity: the same backend with the same settings, in this process (``TTSEngine`` over the backend the
server builds), with ``--streams`` replies always in flight and consumers unpaced (what
scripts/bench_engine.py measures); a load of 0.6 offers 0.6 of that many seconds of audio per second.

Per load, from the devices' side: the reply's first audio (query to first frame) p50/p95/p99; each
sentence after the first: how late its first frame came after the audio before it had finished playing
(``late_starts``: over one frame late, and their p95); mid-reply underruns (the device's queue ran dry
before the reply's last frame); audio per second delivered; engine busy %, for gpu-sim the steps the
server ran (from /metrics or the workers) times the step's cost (``python_ms + step_ms``).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from dataclasses import dataclass, field

from gateway.xiaozhi import TtsSentenceStart
from scripts.bench_process_stats import child_pids, engine_steps
from scripts.bench_traffic import Reply, make_replies, play_reply, poisson_arrivals
from scripts.device_sim import DeviceSimulator, Turn
from tts_engine.build import build_backend
from tts_engine.engine import TTSEngine
from tts_engine.settings import Settings

FRAME_S = 0.06


@dataclass
class LoadRow:
    load: float
    replies: int = 0
    failed: int = 0
    first: list[float] = field(default_factory=list)
    sentence_gaps: list[float] = field(default_factory=list)  # each later sentence: first frame after dry
    underruns: int = 0
    audio_s: float = 0.0
    wall_s: float = 0.0
    steps: float = 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def sentence_gaps(turn: Turn) -> tuple[list[float], int]:
    """For each sentence after the first: how long the device had nothing to play before its first frame;
    and the underruns inside sentences (the queue ran dry between two frames of one sentence)."""
    gaps: list[float] = []
    underruns = 0
    play_end: float | None = None
    new_sentence = False
    started = False
    for record in turn.records:
        if isinstance(record.event, TtsSentenceStart):
            new_sentence = started
            continue
        if record not in turn.frames:
            continue
        if play_end is not None:
            dry = record.t - play_end
            if new_sentence:
                gaps.append(max(0.0, dry))
            elif dry > 0.005:
                underruns += 1
        started, new_sentence = True, False
        play_end = max(record.t, play_end or record.t) + FRAME_S
    return gaps, underruns


async def measure_capacity(args: argparse.Namespace, streams: int, rate: int, seed: int) -> tuple[float, float]:
    """(audio seconds per second, mean audio seconds per reply) of the server's backend, in this process."""
    options = {"step_ms": args.gpu_sim_step_ms, "python_ms": args.gpu_sim_python_ms} if args.backend == "gpu-sim" else {}
    backend = build_backend(args.backend, "cpu", Settings(), options)
    engine = TTSEngine(backend, max_queue_wait_s=None, max_pending_requests=4096)
    await engine.start()
    try:
        replies = make_replies(3 * streams, seed)
        pending = list(enumerate(replies))
        audio = 0.0

        async def worker() -> None:
            nonlocal audio
            while pending:
                number, reply = pending.pop(0)
                records = await play_reply(engine, reply, number, voice="default", rate=rate, paced=False)
                audio += sum(r.audio_s for r in records)

        start = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(streams):
                group.create_task(worker())
        return audio / (time.perf_counter() - start), audio / len(replies)
    finally:
        await engine.close()


async def one_turn(url: str, number: int, reply: Reply, at: float, row: LoadRow) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    sim = DeviceSimulator(url, decode=False, device_id=f"poisson-{row.load:g}-{number}")
    try:
        await sim.connect()
        await sim.listen_start("auto")
        turn = await sim.ask(" ".join(reply.sentences), timeout=300)
        if turn.first_audio_latency is not None:
            row.first.append(turn.first_audio_latency)
        gaps, underruns = sentence_gaps(turn)
        row.sentence_gaps += gaps
        row.underruns += underruns
        row.audio_s += len(turn.frames) * FRAME_S
        row.replies += 1
    except Exception as exc:  # a failed turn is counted, the run goes on
        row.failed += 1
        print(f"reply {number}: {type(exc).__name__}: {exc}", flush=True)
    finally:
        await sim.close()


async def run_poisson(url: str, proc: subprocess.Popen[bytes], args: argparse.Namespace) -> None:
    cap, reply_audio_s = await measure_capacity(args, args.streams, 16000, args.seed + 7)
    print(f"capacity ({args.backend}, in this process): {cap:.2f} audio s/s with {args.streams} replies in "
          f"flight, consumers unpaced; {reply_audio_s:.2f} s of audio per reply", flush=True)  # fmt: skip
    print(" load replies failed first_p50_ms first_p95_ms first_p99_ms late_starts late_p95_ms "
          "underruns audio_per_s busy_pct", flush=True)  # fmt: skip
    step_cost_s = (args.gpu_sim_python_ms + args.gpu_sim_step_ms) / 1000
    for load in (float(x) for x in args.load.split(",") if x.strip()):
        replies = make_replies(args.replies, args.seed)
        arrivals = poisson_arrivals(args.replies, load * cap / reply_audio_s, args.seed)
        row = LoadRow(load)
        workers = child_pids(proc.pid)
        steps0 = await engine_steps(url, workers)
        t0 = time.monotonic()
        async with asyncio.TaskGroup() as group:
            for number, (reply, at) in enumerate(zip(replies, arrivals, strict=True)):
                group.create_task(one_turn(url, number, reply, t0 + at, row))
        row.wall_s = time.monotonic() - t0
        row.steps = await engine_steps(url, workers) - steps0
        late = [g for g in row.sentence_gaps if g > FRAME_S]
        busy = 100 * row.steps * step_cost_s / row.wall_s if args.backend == "gpu-sim" else float("nan")
        print(
            f"{load:5.2f} {row.replies:7d} {row.failed:6d} {1000 * percentile(row.first, 50):12.0f} "
            f"{1000 * percentile(row.first, 95):12.0f} {1000 * percentile(row.first, 99):12.0f} "
            f"{len(late):11d} {1000 * percentile(late, 95):11.0f} {row.underruns:9d} "
            f"{row.audio_s / row.wall_s:11.2f} {busy:8.1f}",
            flush=True,
        )

