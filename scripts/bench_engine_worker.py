"""The cost of the worker protocol: the same requests to an in-process engine and to one worker process.

    python scripts/bench_engine_worker.py [--requests 200] [--concurrency 16] [--backend fake]

Prints first-chunk latency (p50/p95) and chunks per second for both, same run, same backend options
(fake: 20 ms per character, 100 ms chunks, computed at once). The worker is a
``python -m tts_engine serve`` process on a unix socket; the client is ``gateway.engine_client.client``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.engine_client.client import EngineClient  # noqa: E402
from gateway.engine_client.workers import WorkerCommand, WorkerSlot  # noqa: E402
from tts_engine import TTSEngine, create_backend  # noqa: E402

TEXT = "the quick brown fox jumps over the lazy dog"


async def run(engine: Any, requests: int, concurrency: int) -> dict[str, float]:
    gate = asyncio.Semaphore(concurrency)
    firsts: list[float] = []
    chunks = 0

    async def one() -> None:
        nonlocal chunks
        async with gate:
            start = time.perf_counter()
            stream = engine.synthesize(TEXT, output_rate=16000)
            async for _ in stream:
                chunks += 1
                if start:
                    firsts.append(time.perf_counter() - start)
                    start = 0.0

    began = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    wall = time.perf_counter() - began
    firsts.sort()
    return {
        "first_chunk_p50_ms": 1000 * statistics.median(firsts),
        "first_chunk_p95_ms": 1000 * firsts[int(0.95 * (len(firsts) - 1))],
        "chunks_per_s": chunks / wall,
        "wall_s": wall,
    }


async def main(args: argparse.Namespace) -> None:
    options = {"sample_rate": 16000, "ms_per_char": 20.0, "chunk_ms": 100}
    local = TTSEngine(create_backend(args.backend, **options))
    await local.start()
    try:
        in_process = await run(local, args.requests, args.concurrency)
    finally:
        await local.close()
    with tempfile.TemporaryDirectory() as tmp:
        settings = {"tts": {"text_normalization": "off"}}
        command = WorkerCommand(args.backend, "cpu", settings, tmp, options)
        client = EngineClient([WorkerSlot(f"unix:{tmp}/w.sock", command=command)])
        await client.start()
        try:
            worker = await run(client, args.requests, args.concurrency)
        finally:
            await client.close()
    print(f"{'':<12} {'p50 first chunk':>16} {'p95 first chunk':>16} {'chunks/s':>10}")
    for name, result in (("in-process", in_process), ("worker", worker)):
        print(
            f"{name:<12} {result['first_chunk_p50_ms']:>13.1f} ms {result['first_chunk_p95_ms']:>13.1f} ms"
            f" {result['chunks_per_s']:>10.0f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--backend", default="fake")
    asyncio.run(main(parser.parse_args()))
