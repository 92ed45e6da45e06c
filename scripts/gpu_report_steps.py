"""The measurements scripts/gpu_report.py runs: one subprocess command per step, in order of value.

Standard library only (the report's driver must not import torch: every measurement runs in its own
process, so a crash, a CUDA error or a timeout in one is recorded and the next one still runs).

Each step has its own time budget (``budget_s``, seconds, shown in the report and by ``--plan``). The
first ones are what a short GPU loan must bring back (``CORE_STEPS``: machine facts, the model, the
single-stream first chunk in bf16, the engine at 1, 4, 16 and 64 streams with caches and CUDA graphs,
the Poisson bench at 0.6 and 0.9 load, the memory plan against the allocator); their budgets add up to
less than 8 minutes with the driver's own probes. The rest run while time remains, each with its own
budget or what is left of the run's, whichever is less.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CORE_STEPS", "FAIL_COMMAND", "Options", "Step", "build_steps", "display_command"]

REPO_ROOT = Path(__file__).resolve().parents[1]
FULL_STREAMS = "1,4,16,64"
BASELINE_MAX_STREAMS = 16  # one-at-a-time runs above this take minutes per level
POISSON_STREAMS = "16"  # the engine's KV slots in the Poisson runs (64 with 150 replies overran 120 s on an H200)
# Replies per load: 16 printed no row within 120 s on an H200 at b573ef0 (paced warm-up and lone sentences);
# 8 finished both loads in about 155 s with them, so the lone sentences now run unpaced and the step has 150 s.
POISSON_REPLIES = "8"
EXPLAIN = 3  # the Poisson run says where its 3 slowest sentence first chunks waited (bench_engine --explain)
NO_FLAG_NOTE = "bench_engine.py has no --flow-cache flag yet: ran with its default (no flow cache)"
# What --fail-step puts in place of a step's command (tests: a failing measurement must not stop the rest).
FAIL_COMMAND = ["-c", "import sys; print('injected failure (--fail-step)'); sys.exit(3)"]
CORE_STEPS = ("facts", "model", "first-chunk-bfloat16", "engine-grid", "poisson", "memory-plan")

FACTS = r"""
import json, os, platform, shutil, subprocess
import torch
facts = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
         "cpus": os.cpu_count(), "disk_free_gib": round(shutil.disk_usage(".").free / 2**30, 1)}
try:
    facts["ram_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
except (ValueError, OSError):
    pass
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        facts[f"gpu{i}"] = {"name": p.name, "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
                            "total_gib": round(total / 2**30, 1), "free_gib": round(free / 2**30, 1)}
    facts["bf16"] = torch.cuda.is_bf16_supported()
    facts["cudnn"] = torch.backends.cudnn.version()
print(json.dumps(facts, indent=1))
if shutil.which("nvidia-smi"):
    q = "name,driver_version,memory.total,memory.used,clocks.max.sm,power.limit,compute_mode,mig.mode.current"
    print(subprocess.run(["nvidia-smi", "--query-gpu=" + q, "--format=csv"], capture_output=True, text=True,
                         timeout=30).stdout)
"""


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
    budget_s: float = 60.0  # its time limit (less when the run has less left)
    min_s: float = 20.0  # below this much time left the step is skipped
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
    if step.script is None and step.args[-1:] == [FACTS]:
        return "python -c '<machine facts: torch, CUDA devices, nvidia-smi, CPUs, RAM, disk>'"
    return shlex.join(["python"] + ([step.script] if step.script else []) + step.args)


def _engine_args(opts: Options, streams: str, *extra: str, sentences: int | None = None) -> list[str]:
    """bench_engine.py in bf16 on this run's model and device; quick: 10 tokens per sentence, 1 s prompt."""
    tokens, prompt, default_sentences = ("10", "1", 1) if opts.quick else ("50", "8", 2)
    return [
        *("--preset", opts.preset, "--model-dir", str(opts.model_dir), "--device", opts.device),
        *("--dtype", "bfloat16", "--streams", streams, "--sentences", str(sentences or default_sentences)),
        *("--tokens-per-sentence", tokens, "--prompt-seconds", prompt, *extra),
    ]


def _poisson_args(opts: Options, *extra: str) -> list[str]:
    """bench_engine.py --arrivals poisson at 0.6 and 0.9 of the measured capacity, bf16."""
    # quick (the CPU test of the report): 3 replies a load and 3 lone sentences. A load's wall time is
    # its arrivals' span plus the last reply's playback, in real time, so a slower machine (a lower
    # capacity, fewer replies a second) takes longer: with 6 replies and 12 lone sentences each Poisson
    # step took 122-126 s of its 150 s on a 2-core AVX2-only EPYC, and one overran it in a full suite run.
    slots, replies, prompt = ("4", "3", "1") if opts.quick else (POISSON_STREAMS, POISSON_REPLIES, "3")
    lone_sentences = ("--lone-sentences", "3") if opts.quick else ()
    return [
        *("--preset", opts.preset, "--model-dir", str(opts.model_dir), "--device", opts.device),
        *("--dtype", "bfloat16", "--arrivals", "poisson", "--load", "0.6,0.9", "--streams", slots),
        *("--replies", replies, "--prompt-seconds", prompt, *extra),
        # The lone first chunk once, at the start: 12 lone sentences after every load would cost a GPU
        # step about as much as a load (its budget is 150 s).
        *("--lone", "start", *lone_sentences),
    ]


def _cache_flag(opts: Options) -> list[str]:
    return ["--flow-cache", "on"] if opts.flow_cache_flag else []


def _model_step(opts: Options) -> Step:
    title = f"model: random weights, {opts.preset} architecture"
    step = Step("model", title, "scripts/make_tiny_model.py", budget_s=60.0, min_s=30.0, needs_model=False)
    step.args = [str(opts.model_dir), "--preset", opts.preset, "--seed", "0", "--no-onnx"]
    if not opts.generate_model:
        step.title = "model: the given model directory"
        step.skip_reason = f"--model-dir given: every step loads {opts.model_dir}"
    return step


def _first_chunk(opts: Options, dtype: str, budget_s: float) -> Step:
    title = f"single stream: per-stage timing and first-chunk latency, {dtype}"
    step = Step(f"first-chunk-{dtype}", title, "scripts/bench_cosyvoice.py", budget_s=budget_s)
    step.args = ["--device", opts.device, "--model-dir", str(opts.model_dir), "--dtype", dtype, "--quick"]
    if opts.quick:
        step.args += ["--decode-tokens", "3", "--prompt-seconds", "1"]
    return step


def _core_steps(opts: Options) -> list[Step]:
    """What a short loan must bring back, in order of value (module docstring)."""
    facts = Step("facts", "machine facts", None, ["-c", FACTS], budget_s=15.0, min_s=5.0, needs_model=False)
    streams = "1,2" if opts.quick else opts.streams
    graphs = ["--cuda-graphs"] if opts.device == "cuda" else []
    title = f"bench_engine: bf16, {streams} streams, flow cache on" + (", CUDA graphs" if graphs else "")
    grid = Step("engine-grid", title, "scripts/bench_engine.py", budget_s=120.0)
    grid.args = _engine_args(opts, streams, *_cache_flag(opts), *graphs, "--no-baseline")
    grid.note = NO_FLAG_NOTE if not opts.flow_cache_flag else ("" if graphs else "no CUDA: without CUDA graphs")
    title = (
        f"bench_engine --arrivals poisson: load 0.6 and 0.9 of the measured capacity (slack step order; "
        f"where the {EXPLAIN} slowest first chunks waited)"
    )
    poisson = Step("poisson", title, "scripts/bench_engine.py", budget_s=150.0, min_s=40.0)
    poisson.args = _poisson_args(opts, *graphs, "--explain", str(EXPLAIN))
    title = "memory plan (tts_engine/memory.py) against torch.cuda.max_memory_allocated"
    plan = Step("memory-plan", title, "scripts/gpu_report_memory.py", budget_s=60.0)  # 26 s on an H200
    plan.args = ["--model-dir", str(opts.model_dir), "--device", opts.device, "--dtype", "bfloat16"]
    if not opts.quick:  # 150 tokens, cache off and on, overran 45 s on an H200; 60 took about 40 s
        plan.args += ["--tokens-per-sentence", "60"]
    else:
        plan.args += ["--streams", "2", "--tokens-per-sentence", "10", "--prompt-seconds", "1"]
    if opts.device != "cuda":
        plan.note = "torch.cuda.max_memory_allocated: skipped: no CUDA device (the plan alone is printed)"
    first_chunk = _first_chunk(opts, "bfloat16", 45.0)  # 23 s on an H200 at b573ef0
    return [facts, _model_step(opts), first_chunk, grid, poisson, plan]


def _rest(opts: Options) -> list[Step]:
    """The rest, while time remains: before / afters, precision, fp32, cache off, baselines, compile."""
    graphs = ["--cuda-graphs"] if opts.device == "cuda" else []
    bench = "scripts/bench_engine.py"
    title = "bench_engine --arrivals poisson: the step order of before (together), for a before / after"
    together = Step("poisson-together", title, bench, budget_s=150.0, min_s=40.0)
    together.args = _poisson_args(opts, *graphs, "--step-order", "together")
    title = (
        "bench_engine --arrivals poisson: openings in calls of their own, closing passes apart "
        "(--rows-cost on, as on a CPU), against the core step's one batch"
    )
    rows_cost = Step("poisson-rows-cost", title, bench, budget_s=150.0, min_s=40.0)
    rows_cost.args = _poisson_args(opts, *graphs, "--rows-cost", "on", "--explain", str(EXPLAIN))
    model, cpu = ("--model-dir", str(opts.model_dir)), opts.device != "cuda"
    precision = Step("precision", "check_precision: bf16 / fp16 against fp32", "scripts/check_precision.py")
    precision.args = [*model, "--preset", opts.preset, "--device", opts.device]
    title = "activation peak per row against the plan's reserve (measure_activations)"
    activations = Step("activations", title, "scripts/measure_activations.py")
    activations.args = [*model, "--preset", opts.preset, "--device", opts.device, "--dtype", "bfloat16"]
    if opts.quick:
        precision.args += ["--tokens", "10", "--dtypes", "bfloat16", "--prompt-seconds", "1"]
        activations.args += ["--rows", "1", "--prompt-seconds", "2", "--flow-steps", "2"]
    else:
        activations.args += ["--rows", "1,4,16", "--prompt-seconds", "10"]
    if cpu:
        activations.note = "CPU: the live-tensor tracker, not torch.cuda.max_memory_allocated"
    streams = "1,2" if opts.quick else opts.streams
    small = ",".join(n for n in streams.split(",") if int(n) <= BASELINE_MAX_STREAMS) or "1"
    cache_off = Step("engine-cache-off", "bench_engine: bf16, flow cache off", bench, budget_s=90.0)
    cache_off.args = _engine_args(opts, streams, "--flow-cache", "off", *graphs, "--no-baseline")
    title = f"bench_engine: bf16, batched vs one request at a time (up to {BASELINE_MAX_STREAMS} streams)"
    one_at_a_time = Step("engine-one-at-a-time", title, bench, budget_s=120.0)
    one_at_a_time.args = _engine_args(opts, small, *_cache_flag(opts))
    title = "bench_engine: flow cache on vs off in one process (issue 18 workload)"
    compare = Step("flow-cache-compare", title, bench, budget_s=120.0)
    compare.args = _engine_args(
        opts, "2" if opts.quick else "8", "--flow-cache", "compare", "--no-baseline", sentences=2 if opts.quick else 4
    )
    if not opts.flow_cache_flag:
        cache_off.skip_reason = "bench_engine.py has no --flow-cache flag (the flow cache has not landed yet)"
        one_at_a_time.note = NO_FLAG_NOTE
    if not opts.flow_cache_compare:
        compare.skip_reason = "bench_engine.py has no --flow-cache compare (the flow cache has not landed yet)"
    title = "bench_engine: bf16, torch.compile (DiT step + vocoder)"
    compiled = Step("engine-torch-compile", title, bench, budget_s=180.0, min_s=60.0)
    compiled.args = _engine_args(opts, streams, *_cache_flag(opts), "--torch-compile", "--no-baseline")
    if cpu and opts.quick:
        compiled.skip_reason = "torch.compile on the CPU takes minutes of inductor compilation (--quick)"
    return [
        rows_cost, together, _first_chunk(opts, "float32", 60.0), precision, cache_off, one_at_a_time, compare, activations,
        compiled,
    ]  # fmt: skip


def build_steps(opts: Options) -> list[Step]:
    """Every measurement in run and report order."""
    steps = [*_core_steps(opts), *_rest(opts)]
    if opts.quick:
        for step in steps:
            step.min_s = min(step.min_s, 20.0)
            if opts.device == "cpu" and step.script not in (None, "scripts/make_tiny_model.py"):
                step.args += ["--threads", "1"]  # a smoke run: no thread oversubscription on a shared CPU
    if opts.fail_step is not None:
        known = [s.key for s in steps]
        if opts.fail_step not in known:
            raise ValueError(f"--fail-step {opts.fail_step!r}: choose one of {', '.join(known)}")
        failing = steps[known.index(opts.fail_step)]
        failing.script, failing.args, failing.skip_reason = None, list(FAIL_COMMAND), None
        failing.note = "failure injected with --fail-step (a test of the report itself)"
    return steps
