"""The measurements scripts/gpu_report.py runs: one subprocess command per step, in report order.

Standard library only (the report's driver must not import torch: every measurement runs in its own
process, so a crash, a CUDA error or a timeout in one is recorded and the next one still runs).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FAIL_COMMAND", "Options", "Step", "build_steps", "display_command"]

REPO_ROOT = Path(__file__).resolve().parents[1]
FULL_STREAMS = "1,4,8,16,32,64"
BASELINE_MAX_STREAMS = 16  # one-at-a-time runs above this take minutes per level
NO_FLAG_NOTE = "bench_engine.py has no --flow-cache flag yet: ran with its default (no flow cache)"
# What --fail-step puts in place of a step's command (tests: a failing measurement must not stop the rest).
FAIL_COMMAND = ["-c", "import sys; print('injected failure (--fail-step)'); sys.exit(3)"]


@dataclass
class Options:
    """What the steps need to know about this run."""

    device: str  # "cuda" or "cpu"
    quick: bool
    model_dir: Path  # the model every step loads (written by the "model" step when generated)
    generate_model: bool  # True: the "model" step writes a random-weight model into model_dir
    preset: str  # "full" or "tiny": the generated model's preset (also passed to the scripts for labels)
    streams: str = FULL_STREAMS
    flow_cache_flag: bool = False  # bench_engine.py has --flow-cache on|off
    flow_cache_compare: bool = False  # ... and --flow-cache compare
    fail_step: str | None = None


@dataclass
class Step:
    """One measurement: its command (None: skipped for ``skip_reason``) and, once run, its result."""

    key: str  # short name: log file, --fail-step
    title: str
    script: str | None  # scripts/<name>.py, or None for a python -c command
    args: list[str] = field(default_factory=list)
    weight: float = 1.0  # share of the remaining time budget
    min_s: float = 30.0  # below this much time left the step is skipped
    needs_model: bool = True
    skip_reason: str | None = None
    note: str = ""
    status: str = "pending"  # pending | running | ok | failed | timed out | skipped
    seconds: float = 0.0
    timeout_s: float = 0.0
    returncode: int | None = None
    output: str = ""

    def argv(self) -> list[str]:
        head = [sys.executable] + ([str(REPO_ROOT / self.script)] if self.script else [])
        return head + self.args


def display_command(step: Step) -> str:
    """The command as one would type it in the repository root."""
    return shlex.join(["python"] + ([step.script] if step.script else []) + step.args)


def _engine_args(opts: Options, streams: str, *extra: str, sentences: int | None = None) -> list[str]:
    """bench_engine.py in bf16 on this run's model and device; quick: 10 tokens per sentence, 1 s prompt."""
    tokens, prompt, default_sentences = ("10", "1", 1) if opts.quick else ("50", "8", 2)
    return [
        *("--preset", opts.preset, "--model-dir", str(opts.model_dir), "--device", opts.device),
        *("--dtype", "bfloat16", "--streams", streams, "--sentences", str(sentences or default_sentences)),
        *("--tokens-per-sentence", tokens, "--prompt-seconds", prompt, *extra),
    ]


def _engine_steps(opts: Options) -> list[Step]:
    """The bf16 grid with the flow cache on and off, batched vs one at a time, the cache's own workload."""
    on = ["--flow-cache", "on"] if opts.flow_cache_flag else []
    no_flag = "" if opts.flow_cache_flag else NO_FLAG_NOTE
    streams = "1,2" if opts.quick else opts.streams
    small = ",".join(n for n in streams.split(",") if int(n) <= BASELINE_MAX_STREAMS) or "1"
    bench = "scripts/bench_engine.py"
    cache_on = Step("engine-cache-on", "bench_engine: bf16, flow cache on", bench, weight=2.0, note=no_flag)
    cache_on.args = _engine_args(opts, streams, *on, "--no-baseline")
    cache_off = Step("engine-cache-off", "bench_engine: bf16, flow cache off", bench, weight=2.0)
    cache_off.args = _engine_args(opts, streams, "--flow-cache", "off", "--no-baseline")
    title = f"bench_engine: bf16, batched vs one request at a time (up to {BASELINE_MAX_STREAMS} streams)"
    one_at_a_time = Step("engine-one-at-a-time", title, bench, weight=2.0, note=no_flag)
    one_at_a_time.args = _engine_args(opts, small, *on)
    title = "bench_engine: flow cache on vs off in one process (issue 18 workload)"
    compare = Step("flow-cache-compare", title, bench, weight=1.5)
    compare.args = _engine_args(
        opts,
        "2" if opts.quick else "8",
        "--flow-cache",
        "compare",
        "--no-baseline",
        sentences=2 if opts.quick else 4,
    )
    if not opts.flow_cache_flag:
        cache_off.skip_reason = "bench_engine.py has no --flow-cache flag (the flow cache has not landed yet)"
    if not opts.flow_cache_compare:
        compare.skip_reason = (
            "bench_engine.py has no --flow-cache compare (the flow cache has not landed yet)"
        )
    return [cache_on, cache_off, one_at_a_time, compare]


def _fast_path_steps(opts: Options) -> list[Step]:
    """CUDA graphs and torch.compile; run last, so compilation gets whatever time is left."""
    on = ["--flow-cache", "on"] if opts.flow_cache_flag else []
    no_flag = "" if opts.flow_cache_flag else NO_FLAG_NOTE
    streams = "1,2" if opts.quick else opts.streams
    bench = "scripts/bench_engine.py"
    graphs = Step("engine-cuda-graphs", "bench_engine: bf16, CUDA graphs (decode step)", bench, weight=2.0)
    graphs.args, graphs.note = _engine_args(opts, streams, *on, "--cuda-graphs", "--no-baseline"), no_flag
    title = "bench_engine: bf16, torch.compile (DiT step + vocoder)"
    compiled = Step("engine-torch-compile", title, bench, weight=3.0, min_s=60.0, note=no_flag)
    compiled.args = _engine_args(opts, streams, *on, "--torch-compile", "--no-baseline")
    if opts.device != "cuda":
        graphs.skip_reason = "CUDA graphs need a CUDA device (this run is on the CPU)"
        if opts.quick:
            compiled.skip_reason = "torch.compile on the CPU takes minutes of inductor compilation (--quick)"
    return [graphs, compiled]


def _model_step(opts: Options) -> Step:
    title = f"model: random weights, {opts.preset} architecture"
    step = Step("model", title, "scripts/make_tiny_model.py", weight=1.0, min_s=300.0, needs_model=False)
    step.args = [str(opts.model_dir), "--preset", opts.preset, "--seed", "0", "--no-onnx"]
    if not opts.generate_model:
        step.title = "model: the given model directory"
        step.skip_reason = f"--model-dir given: every step loads {opts.model_dir}"
    return step


def _single_stream_steps(opts: Options) -> list[Step]:
    args = ["--device", opts.device, "--model-dir", str(opts.model_dir)]
    if opts.quick:
        args += ["--quick", "--decode-tokens", "3", "--prompt-seconds", "1"]
    steps = []
    for dtype in ("bfloat16", "float32"):
        title = f"single stream: per-stage timing and first-chunk latency, {dtype}"
        step = Step(f"first-chunk-{dtype}", title, "scripts/bench_cosyvoice.py", weight=0.5)
        step.args = [*args, "--dtype", dtype]
        steps.append(step)
    return steps


def _memory_steps(opts: Options) -> list[Step]:
    model, cpu = ("--model-dir", str(opts.model_dir)), opts.device != "cuda"
    precision = Step("precision", "check_precision: bf16 / fp16 against fp32", "scripts/check_precision.py")
    precision.args = [*model, "--preset", opts.preset, "--device", opts.device]
    title = "activation peak per row against the plan's reserve (measure_activations)"
    activations = Step("activations", title, "scripts/measure_activations.py")
    activations.args = [*model, "--preset", opts.preset, "--device", opts.device, "--dtype", "bfloat16"]
    title = "memory plan (tts_engine/memory.py) against torch.cuda.max_memory_allocated"
    plan = Step("memory-plan", title, "scripts/gpu_report_memory.py")
    plan.args = [*model, "--device", opts.device, "--dtype", "bfloat16"]
    if opts.quick:
        precision.args += ["--tokens", "10", "--dtypes", "bfloat16", "--prompt-seconds", "1"]
        activations.args += ["--rows", "1", "--prompt-seconds", "2", "--flow-steps", "2"]
        plan.args += ["--streams", "2", "--tokens-per-sentence", "10", "--prompt-seconds", "1"]
    else:
        activations.args += ["--rows", "1,2,4,8,16", "--prompt-seconds", "10"]
    if cpu:
        activations.note = "CPU: the live-tensor tracker, not torch.cuda.max_memory_allocated"
        plan.note = "torch.cuda.max_memory_allocated: skipped: no CUDA device (the plan alone is printed)"
    return [precision, activations, plan]


def build_steps(opts: Options) -> list[Step]:
    """Every measurement in run and report order."""
    steps = [
        _model_step(opts),
        *_single_stream_steps(opts),
        *_engine_steps(opts),
        *_memory_steps(opts),
        *_fast_path_steps(opts),
    ]
    if opts.quick:
        for step in steps:
            step.min_s = 60.0  # tiny steps: each may take a minute on a loaded machine
            if opts.device == "cpu" and step.script != "scripts/make_tiny_model.py":
                step.args += ["--threads", "1"]  # a smoke run: no thread oversubscription on a shared CPU
    if opts.fail_step is not None:
        known = [s.key for s in steps]
        if opts.fail_step not in known:
            raise ValueError(f"--fail-step {opts.fail_step!r}: choose one of {', '.join(known)}")
        failing = steps[known.index(opts.fail_step)]
        failing.script, failing.args, failing.skip_reason = None, list(FAIL_COMMAND), None
        failing.note = "failure injected with --fail-step (a test of the report itself)"
    return steps
