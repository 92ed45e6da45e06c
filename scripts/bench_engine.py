"""Engine-level serving benchmark: N concurrent streams through one batching TTSEngine vs one at a time.

    python scripts/bench_engine.py [--streams 1,4,8,16,32] [--preset tiny|full] [--device cpu|cuda]
                                   [--tokens-per-sentence 50] [--sentences 2] [--rate 16000]
                                   [--max-lead-s 2.0] [--gpu-memory-gib G] [--model-dir DIR] [--no-baseline]
                                   [--max-hop-rows 16] [--cuda-graphs] [--torch-compile]
                                   [--prompt-seconds 3] [--flow-cache on|off|compare]
                                   [--final-pass exact|streaming]

Random weights (``scripts.make_tiny_model``; ``full`` has the Fun-CosyVoice3-0.5B-2512 dimensions, about
3.4 GB, written once under ``models/.bench/``) and a synthetic speaker; the LLM is forced to emit exactly
``--tokens-per-sentence`` speech tokens per sentence (``CosyVoiceBackend(fixed_llm_tokens=...)``; 25
tokens = 1 s), so the work is that of real speech. Each stream asks for ``--sentences`` sentences one
after the other (the next as soon as the previous one's audio has arrived, as the gateway does) and
plays them at real time: a consumer with a ``--max-lead-s`` playback buffer that reads no further ahead.

Per concurrency it prints: first-chunk latency p50/p95 (from the common start to the arrival of each
stream's first chunk; later stalls do not move it), per-stream real-time factor (time from request
to its last chunk / audio seconds; the playback buffer bounds it below by (audio - lead) / audio), the
aggregate seconds of audio per second of wall time, the share of streams that ever ran dry (a chunk
arrived after the audio before it had finished playing), the mean batch size, and peak memory (CUDA:
``max_memory_allocated``; CPU: the engine's planned weights + KV pool). Then the same streams through
an engine that serves one request at a time (``max_batch_size=1``: the rest queue), and the ratios.

Every stream speaks in its own voice (a synthetic speaker of ``--prompt-seconds``), so with the flow
cache on (cosyvoice/flow/chunk_cache.py) a stream's first sentence computes its voice's prompt chunks
and its later sentences start from them. ``--flow-cache compare`` runs every level with the cache on and
then off (no one-at-a-time runs) and prints ``streams=N: flow cache on / off aggregate audio/s = X.XXx;
first-chunk p95 off / on = Y.YYx``.

Paced vs capacity (compare mode): paced consumers read no further than ``--max-lead-s`` ahead of real
time, so once the engine is faster than real time a run's aggregate audio/s is bounded by playback
(about ``streams`` s/s) and the on / off ratio reads ~1.0x whatever the engine does. So compare mode
also runs each level's workload with consumers that read every chunk as soon as it arrives (no
playback pacing; rows ``cap-on`` / ``cap-off``): that audio/s is the engine's capacity for this
workload, and the final line's audio/s ratio is taken from those rows. The four runs are repeated in
``--compare-repeats`` interleaved rounds (default 3) and each keeps its best (highest audio/s, lowest
first-chunk p95), as timeit advises for a shared machine. First-chunk p95 and dry_% in
the final line and in the ``cache-on`` / ``cache-off`` rows come from the paced runs (the capacity
rows' dry_% only says where playback would have stalled; their slack ranking sees no playback).

Realistic arrivals (``--arrivals poisson --load 0.3,0.6,0.9 --streams 16``): instead of streams that
start together, replies (1-6 Chinese or English sentences of realistic lengths, fixed seed; the LLM
emits as many speech tokens as each sentence takes to say) arrive as a Poisson process at each
fraction of the engine's measured capacity and are played as the gateway plays them (scripts/
bench_traffic.py: the next sentence requested while the last plays, device priority, the listener's
playback credit refreshed, chunks taken at the gateway's 0.3 s lead). ``--streams`` is the engine's KV
slots. It first measures the lone-stream first chunk (one sentence at a time on an idle engine, the
median of 12) and the capacity (``--streams`` replies played at once, unpaced: audio s per s), then per
load prints each sentence's first chunk p50/p95/p99 (request to first chunk, every sentence, not only
each reply's), p95 over the lone first chunk (``lone_ms``: with ``--lone bracket``, the default, the
mean of the lone first chunks measured right before and right after that load, as this machine's speed
drifts within minutes; ``--lone start``: the one measured at the start, for every load), the replies'
own first chunk p95, mid-stream underruns
(a started sentence ran dry; and how many sentences did), late starts (a sentence began after the one
before had finished playing), failures, aggregate audio/s, the engine's busy share and the closing
pass's share of it. ``--step-order together`` runs the step order of before (for a before / after).
``--explain N`` records every step's calls (tts_engine/backends/cosyvoice/timeline.py; on a GPU each
call synchronised, so its time is its kernels') and prints, after each load's row, where its N slowest
sentence first chunks waited: time inside steps by kind of call, time outside steps, the longest calls.
``--rows-cost on|off`` overrides the engine's choice by device (``BatchedStep.rows_cost``: on a CPU the
opening hops in calls of their own and the short lane's closing passes apart; on a GPU one batch), for a
before / after on a GPU.
The run prints the commit and every setting; seeds are fixed (``--seed``).

Imports only torch / numpy / tokenizers / safetensors / pyyaml / onnxruntime (no web stack).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from cosyvoice.model import CosyVoice3  # noqa: E402
from scripts.bench_cosyvoice import synthetic_speaker  # noqa: E402
from scripts.make_tiny_model import bench_model_dir  # noqa: E402
from tts_engine import TTSEngine  # noqa: E402
from tts_engine.backends.cosyvoice import CosyVoiceBackend  # noqa: E402
from tts_engine.memory import MemoryBudget  # noqa: E402
from tts_engine.voices import VoicePreset, preset_cache_path  # noqa: E402

SENTENCE = "今天天气很好，我们一起去公园散步吧。"
TOKENS_PER_SECOND = 25
MIB = 1 << 20
MODES = (("cache-on", True, True), ("cache-off", False, True), ("cap-on", True, False), ("cap-off", False, False))


@dataclass
class StreamResult:
    first_chunk_s: float
    rtf: float
    audio_s: float
    ran_dry: bool


@dataclass
class RunResult:
    streams: list[StreamResult]
    wall_s: float
    mean_batch: float
    peak_mib: float

    def row(self) -> dict[str, float]:
        first = sorted(s.first_chunk_s for s in self.streams)
        return {
            "first_p50_ms": 1000 * statistics.median(first),
            "first_p95_ms": 1000 * first[min(len(first) - 1, round(0.95 * (len(first) - 1)))],
            "rtf_mean": statistics.fmean(s.rtf for s in self.streams),
            "audio_per_s": sum(s.audio_s for s in self.streams) / self.wall_s,
            "ran_dry_pct": 100 * sum(s.ran_dry for s in self.streams) / len(self.streams),
            "mean_batch": self.mean_batch,
            "peak_mib": self.peak_mib,
        }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,4,8,16,32", help="comma-separated concurrency levels")
    parser.add_argument("--preset", choices=("tiny", "full"), default="tiny")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--tokens-per-sentence", type=int, default=50)
    parser.add_argument("--sentences", type=int, default=2, help="sentences per stream")
    parser.add_argument("--rate", type=int, default=16000, help="output sample rate of every stream")
    parser.add_argument("--max-lead-s", type=float, default=2.0, help="consumer playback buffer (seconds)")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="engine budget (default: none)")
    parser.add_argument("--max-llm-len", type=int, default=1024)
    parser.add_argument("--prompt-seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--no-baseline", action="store_true", help="skip the one-at-a-time runs")
    parser.add_argument("--max-hop-rows", type=int, default=16, help="flow + vocoder rows per step")
    parser.add_argument("--cuda-graphs", action="store_true", help="decode step as CUDA graphs (CUDA only)")
    parser.add_argument("--torch-compile", action="store_true", help="DiT step + vocoder via torch.compile")
    parser.add_argument("--flow-cache", choices=("on", "off", "compare"), default="on", help="flow chunk cache")
    parser.add_argument("--final-pass", choices=("exact", "streaming"), default="exact", help="closing flow call")
    parser.add_argument(
        "--compare-repeats", type=int, default=3, help="compare mode: interleaved rounds of the 4 runs (best of each)"
    )
    parser.add_argument("--arrivals", choices=("together", "poisson"), default="together", help="how streams start")
    parser.add_argument("--load", default="0.3,0.6,0.9", help="poisson: fractions of the measured capacity")
    parser.add_argument("--replies", type=int, default=60, help="poisson: replies per load")
    parser.add_argument("--voices", type=int, default=4, help="poisson: voices the replies take turns in")
    parser.add_argument("--seed", type=int, default=0, help="poisson: seed of the replies and their arrivals")
    parser.add_argument("--step-order", choices=("slack", "together"), default="slack", help="engine.step_order")
    parser.add_argument(
        "--capacity", type=float, default=None, help="poisson: audio s/s taken as the capacity (default: measured)"
    )
    parser.add_argument(
        "--rows-cost", choices=("auto", "on", "off"), default="auto",
        help="poisson: openings in calls of their own and closing passes apart (auto: on a CPU only)",
    )  # fmt: skip
    parser.add_argument(
        "--lone", choices=("bracket", "start"), default="bracket",
        help="poisson: each load's lone first chunk: measured before and after it (mean), or once at the start",
    )
    parser.add_argument(
        "--lone-sentences", type=int, choices=range(1, 13), default=12, metavar="1..12",
        help="poisson: how many reference sentences make the lone first chunk (their median; default 12)",
    )
    parser.add_argument(
        "--explain", type=int, default=0, metavar="N",
        help="poisson: after each load, what the engine ran while its N slowest sentence first chunks waited",
    )  # fmt: skip
    return parser.parse_args(argv)


def load_model(args: argparse.Namespace) -> CosyVoice3:
    model = CosyVoice3.from_pretrained(
        bench_model_dir(args.preset, model_dir=args.model_dir),
        device=torch.device(args.device),
        dtype=getattr(torch, args.dtype),
        max_seconds=60,
    )
    if args.torch_compile:  # what CosyVoiceBackend(torch_compile=True) does, once for every level's backend
        from cosyvoice.token2wav.compile import compile_token2wav

        compile_token2wav(model.token2wav, backend="inductor")
    return model


def make_backend(
    model: CosyVoice3, args: argparse.Namespace, max_batch: int, voice_dir: Path, num_voices: int = 1,
    flow_cache: bool = True, tokens: int | Callable[[str], int] | None = None,
) -> CosyVoiceBackend:  # fmt: skip
    budget = None
    if args.gpu_memory_gib is not None:
        budget = MemoryBudget.from_gib(args.gpu_memory_gib, args.device)
    backend = CosyVoiceBackend(
        model=model, seed=0, max_batch_size=max_batch, max_llm_len=args.max_llm_len, voice_cache_dir=voice_dir,
        memory_budget=budget, fixed_llm_tokens=tokens or args.tokens_per_sentence, max_hop_rows=args.max_hop_rows,
        cuda_graphs=args.cuda_graphs,  # torch.compile is applied once to the shared model (load_model)
        flow_cache=flow_cache, final_pass=args.final_pass, step_order=args.step_order,
    )  # fmt: skip
    # Synthetic speakers, one per stream, registered through the voice cache (no ONNX frontend needed).
    for i in range(num_voices):
        wav = voice_dir / f"bench{i}.wav"
        wav.write_bytes(f"synthetic speaker {i}: see bench_cosyvoice.synthetic_speaker".encode())
        preset = VoicePreset(name=f"bench{i}", prompt_wav=wav, prompt_text="synthetic")
        record = synthetic_speaker(model, args.prompt_seconds)
        gen = torch.Generator().manual_seed(i)
        record.prompt_speech_tokens.copy_(torch.randint(0, 6561, record.prompt_speech_tokens.shape, generator=gen))
        record.save(preset_cache_path(preset, voice_dir, key=backend.fingerprint))
        backend.add_voice(preset)
    return backend


async def one_stream(
    engine: TTSEngine, args: argparse.Namespace, start: float, voice: str, paced: bool = True
) -> StreamResult:
    """Sentences one after the other, consumed at real time with a bounded playback buffer (``paced``)
    or as fast as the chunks come (a capacity measurement)."""
    first_at: float | None = None  # when the first chunk arrived
    played_from = 0.0  # playback clock: when the audio received so far started to play (moves on a stall)
    audio_s = 0.0  # audio received so far
    ran_dry = False
    for _ in range(args.sentences):
        async for chunk in engine.synthesize(SENTENCE, voice=voice, output_rate=args.rate):
            now = time.perf_counter()
            if first_at is None:
                first_at = played_from = now
            elif now > played_from + audio_s:  # everything received before had finished playing
                ran_dry = True
                played_from = now - audio_s  # playback resumes when the chunk arrives
            audio_s += chunk.size / args.rate
            lead = played_from + audio_s - now  # buffered audio not yet played
            if paced and lead > args.max_lead_s:
                await asyncio.sleep(lead - args.max_lead_s)
    last = time.perf_counter()
    if first_at is None:
        raise RuntimeError("the stream produced no audio")
    return StreamResult(first_at - start, (last - start) / max(audio_s, 1e-9), audio_s, ran_dry)


async def run_level(
    model: CosyVoice3, args: argparse.Namespace, num_streams: int, max_batch: int, flow_cache: bool | None = None,
    paced: bool = True,
) -> RunResult:  # fmt: skip
    flow_cache = args.flow_cache != "off" if flow_cache is None else flow_cache
    with tempfile.TemporaryDirectory() as tmp:
        backend = make_backend(model, args, max_batch, Path(tmp), num_streams, flow_cache)
        engine = TTSEngine(backend, max_queue_wait_s=None, max_pending_requests=max(256, 2 * num_streams))
        await engine.start()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        try:
            start = time.perf_counter()
            streams = await asyncio.gather(
                *(one_stream(engine, args, start, f"bench{i}", paced) for i in range(num_streams))
            )
            wall = time.perf_counter() - start
            stats = engine.stats
        finally:
            await engine.close()
    if args.device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() / MIB
    else:
        peak = stats.get("memory_used_bytes", 0) / MIB
    return RunResult(list(streams), wall, float(stats["mean_batch_size"]), peak)


def print_row(label: str, n: int, row: dict[str, float]) -> None:
    print(
        f"{label:<9} {n:>7} {row['first_p50_ms']:>9.0f} {row['first_p95_ms']:>9.0f} {row['rtf_mean']:>8.2f} "
        f"{row['audio_per_s']:>10.2f} {row['ran_dry_pct']:>8.0f} {row['mean_batch']:>7.1f} {row['peak_mib']:>9.0f}"
    )


async def main_async(args: argparse.Namespace) -> None:
    levels = [int(n) for n in args.streams.split(",") if n.strip()]
    model = load_model(args)
    audio_s = args.sentences * args.tokens_per_sentence / TOKENS_PER_SECOND
    print(
        f"preset={args.preset} device={args.device} dtype={args.dtype} tokens/sentence={args.tokens_per_sentence} "
        f"sentences/stream={args.sentences} (~{audio_s:.1f} s audio per stream) rate={args.rate} "
        f"lead={args.max_lead_s}s threads={torch.get_num_threads()} max_hop_rows={args.max_hop_rows} "
        f"cuda_graphs={args.cuda_graphs} torch_compile={args.torch_compile} prompt={args.prompt_seconds}s "
        f"flow_cache={args.flow_cache} final_pass={args.final_pass}"
    )
    await run_level(model, args, 1, 1)  # warm-up
    header = (
        f"{'engine':<9} {'streams':>7} {'p50_ms':>9} {'p95_ms':>9} {'rtf':>8} {'audio/s':>10} {'dry_%':>8}"
    )
    print(header + f" {'batch':>7} {'peak_MiB':>9}")
    ratios = []
    if args.flow_cache == "compare":
        for n in levels:
            # Rounds of the 4 runs, interleaved; each mode keeps its best run (highest audio/s, lowest p95):
            # on a shared machine a load spike then slows one run, not one whole mode.
            best: dict[str, dict[str, float]] = {}
            for _ in range(max(1, args.compare_repeats)):
                for label, cache, paced_run in MODES:
                    row = (await run_level(model, args, n, max(levels), flow_cache=cache, paced=paced_run)).row()
                    print_row(label, n, row)
                    sys.stdout.flush()
                    kept = best.setdefault(label, dict(row))
                    kept["audio_per_s"] = max(kept["audio_per_s"], row["audio_per_s"])
                    kept["first_p95_ms"] = min(kept["first_p95_ms"], row["first_p95_ms"])
            on, off, cap_on, cap_off = (best[label] for label, _, _ in MODES)
            paced = on["audio_per_s"] / off["audio_per_s"]
            capacity = cap_on["audio_per_s"] / cap_off["audio_per_s"]
            ratios.append((n, capacity, off["first_p95_ms"] / on["first_p95_ms"], paced))
        for n, capacity, latency, paced in ratios:
            print(f"streams={n}: flow cache on / off aggregate audio/s = {capacity:.2f}x; "
                  f"first-chunk p95 off / on = {latency:.2f}x "
                  f"(best of {max(1, args.compare_repeats)} interleaved rounds; audio/s: capacity runs, "
                  f"consumers unpaced; paced runs {paced:.2f}x; p95: paced runs)")  # fmt: skip
        return
    for n in levels:
        batched = (await run_level(model, args, n, max(levels))).row()
        print_row("batched", n, batched)
        if not args.no_baseline:
            solo = (await run_level(model, args, n, 1)).row()
            print_row("one-at-1", n, solo)
            ratios.append(
                (
                    n,
                    batched["audio_per_s"] / solo["audio_per_s"],
                    solo["first_p95_ms"] / batched["first_p95_ms"],
                )
            )
        sys.stdout.flush()
    for n, throughput, latency in ratios:
        print(f"streams={n}: aggregate audio/s batched / one-at-a-time = {throughput:.2f}x; "
              f"first-chunk p95 one-at-a-time / batched = {latency:.2f}x")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.arrivals == "poisson":
        from scripts.bench_engine_poisson import run_poisson

        asyncio.run(run_poisson(args, load_model(args), make_backend))
    else:
        asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
