"""Service benchmark (issue 26): do batch jobs leave devices alone, how much of the idle engine a batch
uses, and how fast a cache hit starts.

    python scripts/bench_service.py                           # 50 devices, a 1,000-item batch, gpu-sim
    python scripts/bench_service.py --devices 20 --items 300 --turns 1    # a quicker look

One gateway in its own process (`python -m gateway serve`, engine in-process, backend gpu-sim: a stand-in
for a GPU model whose batched step costs the same for 1 or 128 streams), then, in one run:

1. idle capacity: --batch-concurrency API streams at once (interactive class, raw PCM read as fast as it
   comes) of the batch's texts: seconds of audio the engine makes per second when nothing else runs (the
   bench's own HTTP reading costs CPU here, so this understates the engine; the nominal capacity of
   gpu-sim at that concurrency, concurrency x chunk_ms / (step_ms + python_ms), is printed too);
2. devices alone: --devices simulated devices (scripts/device_sim.py) x --turns typed turns: time from
   query to first audio frame, p50/p95;
3. a --items batch job (POST /v1/audio/batches, every item --item-chars characters) alone for
   --window-s: its throughput as a share of (1);
4. the same devices again while the batch runs, and the batch's throughput meanwhile; the job is then
   cancelled and the devices run once more alone: first audio p95 with the batch / the mean of the two
   phases without it (before and after, so drift of a shared machine cancels) (goal <= 1.10x);
5. the audio cache: first byte of a new sentence (a miss, synthesised) vs the same request again (a hit),
   --cache-repeats sentences, median of each and their ratio (fake backend timings on the same server).

Device turns skip the cache here (cache.devices: false): they measure the engine's priority classes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.bench_gateway import Stats, free_port, percentile, run_device, server_process, wait_ready  # noqa: E402
from tts_engine.backends.fake import FakeBackend  # noqa: E402

RATE = 24000


def item_text(i: int, chars: int) -> str:
    text = f"Line {i} of the long book, read aloud for the listener"
    return (text + " and more" * (chars // 9 + 1))[:chars]


async def devices_phase(url: str, devices: int, turns: int, ramp_s: float) -> Stats:
    stats = Stats()
    t0 = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        for i in range(devices):
            tg.create_task(run_device(url, i, turns, stats, t0 + ramp_s * i / max(devices, 1)))
    return stats


async def idle_capacity(client: httpx.AsyncClient, url: str, n: int, chars: int) -> float:
    """Audio seconds per second from ``n`` API streams at once (distinct texts: no cache)."""

    async def one(i: int) -> int:
        size = 0
        async with client.stream("POST", f"{url}/v1/audio/speech",
                                 json={"input": item_text(100_000 + i, chars), "response_format": "pcm"}) as reply:  # fmt: skip
            async for piece in reply.aiter_bytes():
                size += len(piece)
        return size

    started = time.monotonic()
    sizes = await asyncio.gather(*(one(i) for i in range(n)))
    return sum(sizes) / 2 / RATE / (time.monotonic() - started)


async def job_done(client: httpx.AsyncClient, url: str, job: str) -> tuple[int, str]:
    state = (await client.get(f"{url}/v1/audio/batches/{job}")).json()
    return state["request_counts"]["completed"], state["status"]


async def first_byte(client: httpx.AsyncClient, url: str, text: str) -> tuple[float, str]:
    """Time to the first audio byte; the answer is read to its end (only a whole answer is cached)."""
    started = time.monotonic()
    first: float | None = None
    async with client.stream("POST", f"{url}/v1/audio/speech", json={"input": text, "response_format": "pcm"}) as r:
        async for _ in r.aiter_bytes():
            if first is None:
                first = time.monotonic() - started
    if first is None:
        raise RuntimeError("no audio")
    return first, r.headers.get("x-cache", "")


async def main_async(args: argparse.Namespace) -> int:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "XZ_ASR__BACKEND": "none", "XZ_ENGINE__WORKERS": "0", "XZ_CACHE__DEVICES": "false",
        "XZ_TTS__TEXT_NORMALIZATION": "basic", "XZ_BATCHES__CONCURRENCY": str(args.batch_concurrency),
        "XZ_BATCHES__MAX_ITEMS": str(max(args.items, 10)), "XZ_SESSION__MEMORY": "none",
        "XZ_BATCHES__DIR": str(Path(args.workdir) / "batches"),
        "XZ_STORE__URL": f"sqlite:///{Path(args.workdir) / 'bench.db'}",
        "XZ_TTS__GPU_SIM__STEP_MS": str(args.gpu_sim_step_ms), "XZ_TTS__GPU_SIM__PYTHON_MS": str(args.gpu_sim_python_ms),
    }  # fmt: skip
    item_s = FakeBackend().num_samples_for(item_text(0, args.item_chars)) / RATE
    chunk_ms = 40.0  # config.yaml tts.gpu_sim.chunk_ms (not changed here)
    nominal = args.batch_concurrency * chunk_ms / (args.gpu_sim_step_ms + args.gpu_sim_python_ms)
    results: dict[str, float | str] = {}
    with server_process("gpu-sim", port, env):
        await wait_ready(url, timeout=180)
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=args.batch_concurrency + 8)) as client:
            capacity = await idle_capacity(client, url, args.batch_concurrency, args.item_chars)
            results["idle_capacity_audio_s_per_s"] = round(capacity, 1)

            alone = await devices_phase(url, args.devices, args.turns, args.ramp)
            p95_alone = percentile(alone.first_audio, 95)

            lines = "".join(json.dumps({"custom_id": f"i{i}", "input": item_text(i, args.item_chars),
                                        "response_format": "pcm"}) + "\n" for i in range(args.items))  # fmt: skip
            reply = await client.post(f"{url}/v1/audio/batches", content=lines.encode(),
                                      headers={"Content-Type": "application/jsonl"})  # fmt: skip
            reply.raise_for_status()
            job = reply.json()["id"]
            while (await job_done(client, url, job))[0] == 0:  # a bench watching from outside
                await asyncio.sleep(0.1)
            done0, t0 = (await job_done(client, url, job))[0], time.monotonic()
            await asyncio.sleep(args.window_s)
            done1, t1 = (await job_done(client, url, job))[0], time.monotonic()
            batch_alone = (done1 - done0) * item_s / (t1 - t0)

            with_batch = await devices_phase(url, args.devices, args.turns, args.ramp)
            done2, state = await job_done(client, url, job)
            t2 = time.monotonic()
            batch_beside = (done2 - done1) * item_s / (t2 - t1)
            await client.post(f"{url}/v1/audio/batches/{job}/cancel")
            p95_batch = percentile(with_batch.first_audio, 95)
            after = await devices_phase(url, args.devices, args.turns, args.ramp)  # brackets the batch phase
            p95_after = percentile(after.first_audio, 95)
            p95_base = (p95_alone + p95_after) / 2

            misses, hits = [], []
            for k in range(args.cache_repeats):
                text = f"A sentence for the cache, number {k}, said twice."
                miss, tag_miss = await first_byte(client, url, text)
                hit, tag_hit = await first_byte(client, url, text)
                assert (tag_miss, tag_hit) == ("miss", "hit"), (tag_miss, tag_hit)
                misses.append(miss)
                hits.append(hit)

    results.update({
        "devices": args.devices, "turns_per_device": args.turns,
        "device_turns_alone": alone.turns, "device_failed_alone": alone.failed,
        "first_audio_p50_ms_alone": round(percentile(alone.first_audio, 50) * 1000, 1),
        "first_audio_p95_ms_alone": round(p95_alone * 1000, 1),
        "device_turns_with_batch": with_batch.turns, "device_failed_with_batch": with_batch.failed,
        "first_audio_p50_ms_with_batch": round(percentile(with_batch.first_audio, 50) * 1000, 1),
        "first_audio_p95_ms_with_batch": round(p95_batch * 1000, 1),
        "first_audio_p95_ms_alone_after": round(p95_after * 1000, 1), "device_failed_after": after.failed,
        "p95_ratio_with_batch_over_alone": round(p95_batch / p95_base, 3),
        "batch_items": args.items, "item_audio_s": round(item_s, 2),
        "batch_alone_audio_s_per_s": round(batch_alone, 1),
        "batch_share_of_idle_capacity_pct": round(100 * batch_alone / capacity, 1),
        # gpu-sim's nominal capacity at this concurrency: every stream gets chunk_ms of audio per step
        "nominal_capacity_audio_s_per_s": round(nominal, 1),
        "batch_share_of_nominal_capacity_pct": round(100 * batch_alone / nominal, 1),
        "batch_beside_devices_audio_s_per_s": round(batch_beside, 1),
        "batch_items_done_by_end_of_device_phase": done2, "batch_status_then": state,
        "cache_miss_first_byte_ms_median": round(statistics.median(misses) * 1000, 2),
        "cache_hit_first_byte_ms_median": round(statistics.median(hits) * 1000, 2),
        "cache_hit_over_miss_ratio": round(statistics.median(hits) / statistics.median(misses), 4),
    })  # fmt: skip
    width = max(map(len, results))
    for name, value in results.items():
        print(f"{name:<{width}}  {value}")
    print(f"goal first-audio p95 ratio <= 1.10: {'met' if results['p95_ratio_with_batch_over_alone'] <= 1.10 else 'NOT met'}")  # type: ignore[operator]
    print(f"goal batch share >= 80 %: {'met' if results['batch_share_of_idle_capacity_pct'] >= 80 else 'NOT met'}")  # type: ignore[operator]
    return 0


def main() -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument("--turns", type=int, default=2, help="typed turns per device, per phase")
    parser.add_argument("--ramp", type=float, default=2.0, help="seconds over which devices connect")
    parser.add_argument("--items", type=int, default=1000, help="batch job items")
    parser.add_argument("--item-chars", type=int, default=60, help="characters per batch item")
    parser.add_argument("--batch-concurrency", type=int, default=64, help="batches.concurrency")
    parser.add_argument("--window-s", type=float, default=6.0, help="the batch-alone measurement window")
    parser.add_argument("--cache-repeats", type=int, default=5)
    parser.add_argument("--gpu-sim-step-ms", type=float, default=20.0)
    parser.add_argument("--gpu-sim-python-ms", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
