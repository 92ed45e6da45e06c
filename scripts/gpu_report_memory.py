"""The engine's memory plan (tts_engine/memory.py) against what CUDA really allocates in an engine run.

    python scripts/gpu_report_memory.py --model-dir DIR [--device cuda] [--dtype bfloat16] [--streams 16]
        [--prompt-seconds 10] [--tokens-per-sentence 150] [--gpu-memory-gib 0.9] [--max-llm-len 1024]

Builds a ``CosyVoiceBackend`` with a memory budget (``--gpu-memory-gib``: GiB, or a fraction of the
device), so the plan sizes its KV pool and activation reserve for ``--streams`` rows, registers a synthetic
``--prompt-seconds`` speaker (as scripts/bench_engine.py does) and runs ``--streams`` requests at once,
each read as fast as it comes (no playback pacing: the most rows in flight). Then it prints the plan next
to ``torch.cuda.memory_allocated`` after start-up (weights + KV pool + anything else resident) and
``torch.cuda.max_memory_allocated`` over the run: the measured activation peak of all rows together
against the plan's reserve. With a backend that has the flow cache (``--flow-cache auto``, the default) it
runs twice: cache off (the activation peak alone) and cache on (activations plus cached chunks against the
whole plan). Every ``memory_*`` and ``flow_cache_*`` figure the engine reports is listed too. On the CPU
the plan is printed and the CUDA peak is reported as skipped.

Imports only torch / numpy / tokenizers / safetensors / pyyaml / onnxruntime (no web stack); used by
scripts/gpu_report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from cosyvoice.model import CosyVoice3  # noqa: E402
from scripts.bench_cosyvoice import synthetic_speaker  # noqa: E402
from tts_engine import TTSEngine  # noqa: E402
from tts_engine.backends.cosyvoice import CosyVoiceBackend  # noqa: E402
from tts_engine.memory import MemoryBudget  # noqa: E402
from tts_engine.voices import VoicePreset, preset_cache_path  # noqa: E402

SENTENCE = "今天天气很好，我们一起去公园散步吧。"
MIB = 1 << 20
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cuda (plan vs allocator peak) or cpu (plan only)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--streams", type=int, default=16, help="requests run at once (= max batch size)")
    parser.add_argument("--prompt-seconds", type=float, default=10.0, help="synthetic speaker prompt")
    parser.add_argument("--tokens-per-sentence", type=int, default=150, help="speech tokens per request")
    parser.add_argument("--gpu-memory-gib", type=float, default=0.9, help="engine budget: GiB or a fraction")
    parser.add_argument("--max-llm-len", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--flow-cache",
        choices=("auto", "on", "off"),
        default="auto",
        help="auto: one run with the flow cache off, one with it on (when the backend has one)",
    )
    args = parser.parse_args(argv)
    if args.streams < 1 or args.tokens_per_sentence < 1:
        parser.error("--streams and --tokens-per-sentence must be >= 1")
    return args


def flow_cache_modes(choice: str) -> list[bool | None]:
    """The runs to make: cache off (a clean activation peak) then on, or one run (None: the engine's default,
    for a backend without the flow cache)."""
    has_cache = "flow_cache" in inspect.signature(CosyVoiceBackend).parameters
    if choice == "auto":
        return [False, True] if has_cache else [None]
    if not has_cache:
        raise SystemExit(f"--flow-cache {choice}: this CosyVoiceBackend has no flow cache")
    return [choice == "on"]


def make_backend(
    model: CosyVoice3, args: argparse.Namespace, voice_dir: Path, flow_cache: bool | None
) -> CosyVoiceBackend:
    extra = {} if flow_cache is None else {"flow_cache": flow_cache}
    backend = CosyVoiceBackend(
        model=model,
        seed=0,
        max_batch_size=args.streams,
        max_llm_len=args.max_llm_len,
        voice_cache_dir=voice_dir,
        memory_budget=MemoryBudget.from_gib(args.gpu_memory_gib, args.device),
        fixed_llm_tokens=args.tokens_per_sentence,
        **extra,
    )
    wav = voice_dir / "report.wav"
    wav.write_bytes(b"synthetic speaker: see bench_cosyvoice.synthetic_speaker")
    preset = VoicePreset(name="report", prompt_wav=wav, prompt_text="synthetic")
    speaker = synthetic_speaker(model, args.prompt_seconds)
    speaker.save(preset_cache_path(preset, voice_dir, key=backend.fingerprint))
    backend.add_voice(preset)
    return backend


async def drain(engine: TTSEngine) -> int:
    samples = 0
    async for chunk in engine.synthesize(SENTENCE, voice="report", output_rate=24000):
        samples += chunk.size
    return samples


async def run(model: CosyVoice3, args: argparse.Namespace, flow_cache: bool | None) -> dict[str, float]:
    cuda = torch.device(args.device).type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        backend = make_backend(model, args, Path(tmp), flow_cache)
        engine = TTSEngine(backend, max_queue_wait_s=None, max_pending_requests=max(256, 2 * args.streams))
        await engine.start()
        resident = 0
        if cuda:
            torch.cuda.synchronize()
            resident = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        try:
            start = time.perf_counter()
            samples = await asyncio.gather(*(drain(engine) for _ in range(args.streams)))
            wall = time.perf_counter() - start
            stats = dict(engine.stats)
        finally:
            await engine.close()
    if cuda:
        torch.cuda.synchronize()
        stats["measured_resident_bytes"] = resident
        stats["measured_peak_bytes"] = torch.cuda.max_memory_allocated()
    stats["run_wall_s"] = wall
    stats["run_audio_s"] = sum(samples) / 24000
    return stats


def _mib(value: float | None) -> str:
    return f"{'-':>10}" if value is None else f"{value / MIB:10.1f}"


def print_plan(stats: dict[str, float], args: argparse.Namespace) -> None:
    rows = int(stats.get("num_slots", args.streams))
    print(f"{'plan item':<36} {'MiB':>10}")
    plan = {
        "budget": stats.get("memory_budget_bytes"),
        "weights (+ fixed scratch)": stats.get("memory_weights_bytes"),
        "KV cache per slot": stats.get("memory_kv_bytes_per_slot"),
        f"KV pool ({rows} slots)": stats.get("memory_kv_pool_bytes"),
        "activation reserve per row": stats.get("memory_activation_bytes_per_row"),
        f"activation reserve ({rows} rows)": stats.get("memory_reserve_bytes"),
        "flow cache": stats.get("memory_flow_cache_bytes"),
        "planned total": stats.get("memory_planned_bytes"),
    }
    for name, value in plan.items():
        print(f"{name:<36} {_mib(value)}")


def print_measured(stats: dict[str, float], args: argparse.Namespace, flow_cache: bool | None) -> None:
    label = {None: "engine default", False: "flow cache off", True: "flow cache on"}[flow_cache]
    print(
        f"\n[{label}] {args.streams} requests at once: {stats['run_audio_s']:.1f} s of audio in "
        f"{stats['run_wall_s']:.1f} s, mean batch {float(stats.get('mean_batch_size', 0)):.1f}"
    )
    if "measured_peak_bytes" not in stats:
        print("cuda max_memory_allocated: skipped: the device is cpu (the allocator peak needs CUDA)")
    else:
        resident, peak = stats["measured_resident_bytes"], stats["measured_peak_bytes"]
        planned, reserve = stats.get("memory_planned_bytes", 0), stats.get("memory_reserve_bytes", 0)
        fixed = stats.get("memory_weights_bytes", 0) + stats.get("memory_kv_pool_bytes", 0)
        active = peak - resident
        what = "activations" + (" + flow cache" if flow_cache else "")
        print(f"{'measured (torch.cuda)':<36} {'MiB':>10} {'plan MiB':>10} {'meas/plan':>9}")
        for name, value, want in (
            ("memory_allocated after start-up", resident, fixed),
            ("max_memory_allocated over the run", peak, planned),
            (f"peak above start-up ({what})", active, reserve),
            ("  per request", active / args.streams, stats.get("memory_activation_bytes_per_row", 0)),
        ):
            ratio = f"{value / want:9.2f}" if want else f"{'-':>9}"
            print(f"{name:<36} {value / MIB:10.1f} {want / MIB:10.1f} {ratio}")
        verdict = "within" if peak <= planned else "OVER"
        print(f"peak {peak / MIB:.0f} MiB is {verdict} the planned {planned / MIB:.0f} MiB")
    others = {
        k: v
        for k, v in stats.items()
        if k.startswith(("memory_", "flow_cache_")) and k not in _PLAN_KEYS and not k.startswith("measured_")
    }
    if others:
        print("other memory figures the engine reports at the end of the run:")
        for key, value in sorted(others.items()):
            shown = f"{value / MIB:10.1f} MiB" if key.endswith("_bytes") else f"{value}"
            print(f"  {key:<40} {shown}")


_PLAN_KEYS = {
    "memory_budget_bytes",
    "memory_weights_bytes",
    "memory_kv_bytes_per_slot",
    "memory_kv_pool_bytes",
    "memory_activation_bytes_per_row",
    "memory_reserve_bytes",
    "memory_flow_cache_bytes",
    "memory_planned_bytes",
}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    modes = flow_cache_modes(args.flow_cache)
    model = CosyVoice3.from_pretrained(
        args.model_dir, device=device, dtype=DTYPES[args.dtype], max_seconds=60
    )
    print(
        f"model={args.model_dir} device={device} dtype={args.dtype} streams={args.streams} "
        f"prompt={args.prompt_seconds}s tokens/request={args.tokens_per_sentence} "
        f"budget={args.gpu_memory_gib} (GiB, or a fraction of the device) torch={torch.__version__}"
    )
    results = [(flow_cache, asyncio.run(run(model, args, flow_cache))) for flow_cache in modes]
    print_plan(results[-1][1], args)  # the plan of the last run (with the flow cache when there is one)
    for flow_cache, stats in results:
        print_measured(stats, args, flow_cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
