"""Gateway benchmark: N simulated devices running typed-text or spoken turns.

    python scripts/bench_gateway.py --devices 100 --backend fake
    python scripts/bench_gateway.py --devices 1,10,50 --backend espeak --turns 2
    python scripts/bench_gateway.py --burst --devices 20,50 --backend espeak --turns 2
    python scripts/bench_gateway.py --speech --devices 1,10,50 [--asr-model DIR]
    python scripts/bench_gateway.py --devices 100 --backend gpu-sim,fake --engine inprocess,worker
    python scripts/bench_gateway.py --devices 100 --transport websocket,mqtt --udp-loss 0,0.05
    python scripts/bench_gateway.py --arrivals poisson --backend gpu-sim --load 0.3,0.6,0.9

With --arrivals poisson, replies of the engine benchmark's traffic arrive as device turns at fractions of
the backend's measured capacity (scripts/bench_gateway_poisson.py has the table's columns).

Starts the server in its own process (so its CPU time can be read from /proc),
connects N devices, each sending typed queries (`listen detect`) and
receiving the paced reply, and prints per concurrency: time from query to
first audio frame (p50/p95), steady frame interval (mean) and gap p99,
underruns as a device would see them (its playback queue ran dry mid-turn),
and server CPU per device (percent of one core).

With --burst the devices connect first and then start every turn at the same
instant (a barrier before each turn), the worst case for the engine and the
pacer: the table then matters most for `late10_pct` (share of the inter-arrival
gaps among each turn's first 10 frames longer than one frame + 5 ms, i.e. 65 ms
at 60 ms frames), `late_pct` (the same over whole turns, pre-buffer burst
excluded) and `underruns`.

With --speech each device talks instead (auto mode): it streams an espeak-ng
utterance as Opus in real time, the server's VAD ends it after
asr.vad.min_silence_ms of silence, FunASR recognises it, and the reply turn
follows. Latencies are then measured from the end of the user's speech: to the
`stt` message and to the first reply audio frame. The recogniser is FunASR with
--asr-model (e.g. a SenseVoiceSmall directory), or else a tiny generated model
(scripts/make_tiny_funasr_model.py) that exercises the same code path at
almost no compute cost.

With --engine the same runs repeat per engine placement: `inprocess` (engine.workers: 0, the engine
thread shares the gateway's interpreter) and `worker` (engine.workers: 1, one engine worker process the
gateway starts). The table then adds engine steps per second (xz_engine_steps_total over the run) and
splits the CPU: `cpu_pct_per_device` is the gateway process alone, `worker_cpu_pct_per_device` the
worker's. `--backend gpu-sim` is a stand-in for a GPU model whose step holds the GIL for
--gpu-sim-python-ms (kernel launches) and then waits --gpu-sim-step-ms with it released.

With --transport websocket,mqtt the same server (its MQTT listener and UDP endpoint on) is measured
with WebSocket devices and with MQTT + UDP devices (scripts/bench_transport.py), the MQTT ones once
per --udp-loss share (datagrams dropped both ways); `udp_lost_pct` is the share of downlink packets
the devices missed, and a gap a lost packet explains is not counted as a late frame.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.xiaozhi import Stt  # noqa: E402
from scripts.bench_gateway_server import free_port, server_process, wait_ready  # noqa: E402
from scripts.bench_gateway_stats import Stats, device_underruns, percentile, print_table  # noqa: E402
from scripts.bench_process_stats import child_pids, cpu_seconds, cpu_seconds_of, engine_steps  # noqa: E402
from scripts.bench_transport import make_device, open_device, prepare_devices, transport_env, udp_counters  # noqa: E402
from scripts.device_sim import DeviceSimulator, Turn  # noqa: E402
from scripts.speech import Utterance, utterance  # noqa: E402

__all__ = [  # the figures and the server are imported from here too (scripts/bench_service.py, tests)
    "Stats", "bench", "device_underruns", "free_port", "percentile", "run_device", "server_process", "wait_ready",
]  # fmt: skip

QUERIES = [
    "Tell me something nice about the weather today, please.",
    "今天天气不错，我们一起去公园散步吧，好不好？",
    "What is the capital of France, and why is it famous?",
]
SPOKEN = [
    "What is the weather like today?",
    "Please play some music for me.",
    "Set a timer for ten minutes.",
]
ENGINE_ENV = {"inprocess": {"XZ_ENGINE__WORKERS": "0"}, "worker": {"XZ_ENGINE__WORKERS": "1"}}


async def speech_turn(sim: DeviceSimulator, clip: Utterance, timeout: float) -> Turn:
    """Streams a spoken query in real time; the turn's clock starts when the speech ends."""
    t0 = time.monotonic()
    sender = asyncio.create_task(sim.send_speech(clip.pcm, realtime=True))
    try:
        return await sim.collect_turn(t0 + clip.end_s, timeout=timeout)
    finally:
        sender.cancel()  # a device stops streaming once it speaks (auto mode)
        with contextlib.suppress(asyncio.CancelledError):
            await sender


async def run_device(
    url: str,
    index: int,
    turns: int,
    stats: Stats,
    start_at: float,
    clips: list[Utterance] | None = None,
    barrier: asyncio.Barrier | None = None,
    sim: DeviceSimulator | None = None,
) -> None:
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    sim = sim or DeviceSimulator(url, decode=False)
    done = 0  # turns this device went through (a failed device still meets the barrier)
    try:
        await open_device(sim)
        await sim.listen_start("auto")
        for k in range(turns):
            if barrier is not None:
                await barrier.wait()  # --burst: every device starts turn k at the same instant
            done += 1
            if clips:
                turn = await speech_turn(sim, clips[(index + k) % len(clips)], timeout=120)
                t_stt = turn.time_of(Stt)
                if t_stt is not None:
                    stats.stt.append(t_stt - turn.t_query)
                await sim.listen_start("auto")  # as the device does after `tts stop`
            else:
                turn = await sim.ask(QUERIES[(index + k) % len(QUERIES)], timeout=120)
            stats.add_turn(turn)
    except Exception as exc:  # a failed device is counted, the run goes on
        stats.failed += 1
        print(f"device {index}: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        await sim.close()
        if barrier is not None:
            for _ in range(done, turns):
                await barrier.wait()


async def bench(
    url: str,
    pid: int,
    devices: int,
    turns: int,
    ramp_s: float,
    clips: list[Utterance] | None = None,
    *,
    burst: bool = False,
    transport: str = "websocket",
    udp_loss: float = 0.0,
) -> dict[str, float]:
    stats = Stats()
    sims = [make_device(url, transport, i, udp_loss) for i in range(devices)]
    await prepare_devices(sims)  # MQTT devices' OTA (their credentials), as at boot: before the clock starts
    workers = child_pids(pid)
    steps0 = await engine_steps(url, workers)
    t0 = time.monotonic()
    cpu0, worker_cpu0 = cpu_seconds(pid), cpu_seconds_of(workers)
    client_cpu0 = time.process_time()  # the simulated devices share this process
    starts = [t0 + ramp_s * i / max(devices, 1) for i in range(devices)]
    barrier = asyncio.Barrier(devices) if burst else None
    async with asyncio.TaskGroup() as tg:
        for i in range(devices):
            tg.create_task(run_device(url, i, turns, stats, starts[i], clips, barrier, sims[i]))
    wall = time.monotonic() - t0
    client_cpu = time.process_time() - client_cpu0
    cpu = cpu_seconds(pid) - cpu0
    worker_cpu = cpu_seconds_of(workers) - worker_cpu0
    steps = await engine_steps(url, workers) - steps0
    return {
        "devices": devices,
        "turns": stats.turns,
        "failed": stats.failed,
        "first_p50_ms": percentile(stats.first_audio, 50) * 1000,
        "first_p95_ms": percentile(stats.first_audio, 95) * 1000,
        "stt_p50_ms": percentile(stats.stt, 50) * 1000,
        "stt_p95_ms": percentile(stats.stt, 95) * 1000,
        "interval_mean_ms": statistics.mean(stats.intervals) * 1000 if stats.intervals else float("nan"),
        "gap_p99_ms": percentile(stats.intervals, 99) * 1000,
        "underruns": stats.underruns,
        "late10_pct": 100 * stats.early_late / stats.early_gaps if stats.early_gaps else float("nan"),
        "late_pct": 100 * stats.late / stats.gaps if stats.gaps else float("nan"),
        "cpu_pct_per_device": 100 * cpu / wall / max(devices, 1),
        "server_cpu_pct": 100 * cpu / wall,
        "worker_cpu_pct_per_device": 100 * worker_cpu / wall / max(devices, 1) if workers else float("nan"),
        "steps_per_s": steps / wall,
        "udp_lost_pct": 100 * stats.lost / (stats.frames + stats.lost) if stats.frames else float("nan"),
        "client_cpu_pct": 100 * client_cpu / wall,
    }

def speech_setup(args: argparse.Namespace, workdir: Path) -> tuple[dict[str, str], list[Utterance]]:
    """Server environment and the spoken clips for --speech."""
    model = args.asr_model
    if model is None:
        from scripts.make_tiny_funasr_model import make_tiny_model

        model = str(make_tiny_model(workdir / "tiny-sensevoice"))
        print(f"ASR: tiny generated FunASR model ({model}); pass --asr-model for a real one")
    env = {"XZ_ASR__BACKEND": "funasr", "XZ_ASR__MODEL": model, "XZ_ASR__ON_LOAD_FAILURE": "error"}
    clips = [utterance(text, lead_s=0.3, tail_s=1.5) for text in SPOKEN]
    return env, clips


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as workdir:
        clips: list[Utterance] | None = None
        asr_env = {"XZ_ASR__BACKEND": "none"}
        if args.speech:
            asr_env, clips = speech_setup(args, Path(workdir))
        engines: list[str | None] = list(args.engine.split(",")) if args.engine else [None]
        for backend in args.backend.split(","):
            for engine in engines:
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                extra = {**asr_env, **ENGINE_ENV.get(engine or "", {})}
                if args.opus_complexity is not None:
                    extra["XZ_AUDIO__OPUS_COMPLEXITY"] = str(args.opus_complexity)
                if backend == "gpu-sim":
                    extra["XZ_TTS__GPU_SIM__STEP_MS"] = str(args.gpu_sim_step_ms)
                    extra["XZ_TTS__GPU_SIM__PYTHON_MS"] = str(args.gpu_sim_python_ms)
                variants = transport_variants(args)
                if any(t == "mqtt" for t, _ in variants):
                    extra.update(transport_env(free_port(), free_port()))
                with server_process(backend, port, extra) as proc:
                    await wait_ready(url, timeout=120)
                    if args.arrivals == "poisson":
                        from scripts.bench_gateway_poisson import run_poisson

                        print(f"\nbackend: {backend}, engine: {engine or 'as configured'}, arrivals: poisson, "
                              f"replies/load={args.replies} seed={args.seed}")  # fmt: skip
                        await run_poisson(url, proc, argparse.Namespace(**{**vars(args), "backend": backend}))
                        continue
                    for transport, loss in variants:
                        rows = []
                        for n in (int(x) for x in args.devices.split(",")):
                            rows.append(
                                await bench(url, proc.pid, n, args.turns, args.ramp, clips, burst=args.burst,
                                            transport=transport, udp_loss=loss)  # fmt: skip
                            )
                        name = None if args.transport is None else (
                            transport if transport == "websocket" else f"mqtt+udp, {100 * loss:g} % loss")
                        print_table(backend, rows, speech=clips is not None, burst=args.burst, engine=engine,
                                    transport=name)  # fmt: skip
                        if transport == "mqtt":  # since the server started
                            counters = await udp_counters(url)
                            print("gateway UDP counters: " + ", ".join(f"{k} {v:g}" for k, v in counters.items()))
    return 0


def transport_variants(args: argparse.Namespace) -> list[tuple[str, float]]:
    """(transport, UDP loss) per table: the WebSocket once, MQTT + UDP once per --udp-loss share."""
    variants: list[tuple[str, float]] = []
    for transport in (args.transport or "websocket").split(","):
        if transport not in ("websocket", "mqtt"):
            raise SystemExit(f"--transport: websocket or mqtt, not {transport!r}")
        losses = [float(x) for x in args.udp_loss.split(",")] if transport == "mqtt" else [0.0]
        variants += [(transport, loss) for loss in losses]
    return variants


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,10,100", help="comma-separated device counts")
    parser.add_argument("--backend", default="fake", help="fake, espeak, gpu-sim (comma-separated: each)")
    parser.add_argument(
        "--engine", default=None, help="inprocess, worker (comma-separated: each); default: as configured"
    )
    parser.add_argument("--gpu-sim-step-ms", type=float, default=20.0, help="gpu-sim: GIL-free wait per step")
    parser.add_argument(
        "--gpu-sim-python-ms", type=float, default=5.0, help="gpu-sim: GIL-held work per step"
    )
    parser.add_argument("--turns", type=int, default=3, help="turns per device")
    parser.add_argument("--ramp", type=float, default=2.0, help="seconds over which devices connect")
    parser.add_argument("--opus-complexity", type=int, default=None, help="override audio.opus_complexity")
    parser.add_argument(
        "--burst", action="store_true", help="start every turn on all devices at the same instant"
    )
    parser.add_argument("--speech", action="store_true", help="spoken turns (VAD + FunASR) instead of typed")
    parser.add_argument("--asr-model", default=None, help="FunASR model for --speech (default: a tiny one)")
    parser.add_argument("--transport", default=None,
                        help="websocket, mqtt (comma-separated: each, on the same server); default: websocket")
    parser.add_argument("--udp-loss", default="0", help="mqtt: shares of UDP datagrams lost both ways, e.g. 0,0.05")
    parser.add_argument("--arrivals", choices=("ramp", "poisson"), default="ramp",
                        help="poisson: replies arrive as a Poisson process (scripts/bench_gateway_poisson.py)")
    parser.add_argument("--load", default="0.3,0.6,0.9", help="poisson: fractions of the measured capacity")
    parser.add_argument("--replies", type=int, default=60, help="poisson: replies per load")
    parser.add_argument("--streams", type=int, default=16, help="poisson: replies in flight for the capacity")
    parser.add_argument("--seed", type=int, default=0, help="poisson: seed of the replies and arrivals")
    args = parser.parse_args()
    if args.arrivals == "poisson":
        from scripts.bench_engine_poisson import git_commit

        print(f"commit={git_commit()} {' '.join(f'{k}={v}' for k, v in sorted(vars(args).items()))}", flush=True)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
