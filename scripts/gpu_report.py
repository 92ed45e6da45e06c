"""Every GPU measurement of the project in one command that fits a short GPU loan, written to one report.

    python scripts/gpu_report.py OUTDIR [--minutes 8] [--model-dir DIR] [--streams 1,4,16,64]
                                 [--keep-model] [--plan] [--allow-cpu --quick] [--fail-step KEY]

The whole run, model generation included, stays within ``--minutes`` (default 8: a GPU is typically lent
for 15 minutes in all, one command at most 10, the machine's start included). Steps run one subprocess each,
in order of value, each with its own time budget (``--plan`` prints them and exits;
scripts/gpu_report_steps.py has the list): machine facts; a random-weight model with the
Fun-CosyVoice3-0.5B dimensions (``make_tiny_model.py --preset full`` into a temporary directory; or
``--model-dir`` with a real one, which saves that step); the single-stream first chunk in bf16
(bench_cosyvoice.py); bench_engine.py at 1, 4, 16, 64 streams with the flow cache and CUDA graphs; the
Poisson bench at 0.6 and 0.9 of the measured capacity; the memory plan against
``torch.cuda.max_memory_allocated`` (gpu_report_memory.py); then, while time remains, the Poisson bench
in the step order of before, fp32, precision, cache off, one-at-a-time, the flow cache's own workload,
activations and torch.compile. A step gets its budget or what is left of the run, whichever is less, and
is skipped when less than its minimum is left; one that runs out of time is killed with its output so far
kept.

The report, ``OUTDIR/YYYY-MM-DD-<device>.md``, holds the date, device, driver and CUDA versions, torch
and package versions, the git commit, which model, each step's exact command, budget, status and output
(the tables), a pivot of bench_engine's aggregate audio/s and first-chunk p95 and the Poisson goal lines.
It is rewritten after every step, so a killed run leaves a partial report; each step's full output is in
``<report>.logs/``.

Without CUDA it refuses (exit 2), unless ``--allow-cpu --quick`` is given: a smoke run of the same steps
on the CPU with the tiny preset, 1-2 streams and a few tokens (what tests/test_gpu_report.py runs, with
the web stack made unimportable); the steps that need CUDA are recorded as skipped with the reason.
``--fail-step KEY`` replaces one step's command with one that fails (to test the report). Exit status: 0
all steps ok or skipped, 1 some step failed or timed out, 2 refused. This driver imports only the
standard library; the steps need torch, numpy, tokenizers, safetensors, pyyaml, msgpack and onnxruntime
(transformers for check_precision), nothing of the web stack (no pydantic, fastapi, soxr or wetext).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from scripts.gpu_report_machine import (  # noqa: E402
    bench_engine_features,
    describe,
    flow_cache_features,
    probe_torch,
)
from scripts.gpu_report_markdown import render  # noqa: E402
from scripts.gpu_report_steps import FULL_STREAMS, Options, Step, build_steps, display_command  # noqa: E402

KILL_GRACE_S = 10.0

__all__ = ["bench_engine_features", "flow_cache_features", "main", "run_step", "step_timeout"]


class Interrupted(Exception):
    """SIGTERM or Ctrl-C while a step ran."""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path, help="where the report (and its logs folder) is written")
    parser.add_argument("--model-dir", type=Path, default=None, help="real model (default: random full-size)")
    parser.add_argument(
        "--minutes", type=float, default=8.0, help="the whole run's time, model generation included (default 8)"
    )
    parser.add_argument("--plan", action="store_true", help="print the steps and their budgets, run nothing")
    parser.add_argument("--streams", default=FULL_STREAMS, help="bench_engine concurrency levels")
    parser.add_argument("--keep-model", action="store_true", help="keep the generated random-weight model")
    parser.add_argument("--allow-cpu", action="store_true", help="with --quick: a CPU smoke run (no GPU)")
    parser.add_argument("--quick", action="store_true", help="tiny preset, 1-2 streams, few tokens")
    parser.add_argument(
        "--fail-step", default=None, help="replace this step's command by a failing one (tests)"
    )
    return parser.parse_args(argv)

def report_path(outdir: Path, device: str, quick: bool) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "gpu"
    stem = f"{dt.datetime.now(dt.UTC):%Y-%m-%d}-{slug}" + ("-quick" if quick else "")
    path, n = outdir / f"{stem}.md", 2
    while path.exists():
        path, n = outdir / f"{stem}-{n}.md", n + 1
    return path


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(step: Step, log_path: Path, timeout: float) -> None:
    """Run one step in its own process group, its output to ``log_path``; never raises for its failure."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    with log_path.open("wb") as log:
        try:
            proc = subprocess.Popen(
                step.argv(),
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            step.status, step.output = "failed", f"could not start: {exc}"
            return
        try:
            step.returncode = proc.wait(timeout=timeout)
            step.status = "ok" if step.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            step.status = "timed out"
        except BaseException:
            _kill_group(proc)
            step.status, step.note = "failed", (step.note + " " if step.note else "") + "interrupted"
            raise
        finally:
            step.seconds = time.perf_counter() - start
            step.output = log_path.read_text(encoding="utf-8", errors="replace")


def step_timeout(step: Step, remaining: float) -> float | None:
    """This step's limit: its budget or the time left, whichever is less; None: less than its minimum left."""
    if remaining < step.min_s:
        return None
    return min(remaining, step.budget_s)


def _run_steps(
    steps: list[Step], header: dict[str, str], report: Path, budget_s: float, start: float
) -> None:
    logs = report.with_suffix(".logs")
    logs.mkdir(parents=True, exist_ok=True)
    have_model = True
    for step in steps:
        if step.status != "pending":
            continue
        if step.needs_model and not have_model:
            step.status, step.skip_reason = "skipped", "no model: the model step did not finish"
            continue
        remaining = budget_s - (time.perf_counter() - start)
        timeout = step_timeout(step, remaining)
        if timeout is None:
            step.status = "skipped"
            step.skip_reason = (
                f"time budget spent ({max(0.0, remaining):.0f} s left, needs {step.min_s:.0f} s)"
            )
            continue
        step.status, step.timeout_s = "running", timeout
        write_atomic(report, render(header, steps, f"in progress (running: {step.title})"))
        print(f"[{time.perf_counter() - start:6.0f} s] {step.key}: limit {timeout:.0f} s", flush=True)
        run_step(step, logs / f"{step.key}.log", timeout)
        print(f"[{time.perf_counter() - start:6.0f} s] {step.key}: {step.status}", flush=True)
        if step.key == "model" and step.status != "ok":
            have_model = False
        write_atomic(report, render(header, steps, "in progress"))


def run_all(steps: list[Step], header: dict[str, str], report: Path, budget_s: float, start: float) -> int:
    """Run the steps in order, rewriting ``report`` after each; 1 when a step failed or timed out."""
    for step in steps:
        if step.skip_reason:
            step.status = "skipped"
    try:
        write_atomic(report, render(header, steps, "in progress"))
        _run_steps(steps, header, report, budget_s, start)
    except (Interrupted, KeyboardInterrupt):
        write_atomic(report, render(header, steps, "interrupted"))
        raise
    header["time budget"] = (
        f"{budget_s / 60:g} min ({budget_s:.0f} s, used {time.perf_counter() - start:.0f} s), model generation included"
    )
    bad = [s.key for s in steps if s.status in ("failed", "timed out")]
    state = "complete" + (f"; failed or timed out: {', '.join(bad)}" if bad else "; every step ok or skipped")
    write_atomic(report, render(header, steps, state))
    return 1 if bad else 0


def print_plan(args: argparse.Namespace) -> int:
    """The steps of a run on a CUDA GPU with these arguments, their budgets and a running total."""
    opts = Options(
        device="cuda", quick=args.quick, model_dir=args.model_dir or Path("<tmp>/model"),
        generate_model=args.model_dir is None, preset="tiny" if args.quick else "full", streams=args.streams,
        flow_cache_flag=True, flow_cache_compare=True,
    )  # fmt: skip
    total = 0.0
    print(f"gpu_report plan: {args.minutes:g} min = {args.budget_s:.0f} s for everything, model generation included")
    print(f"{'step':<22} {'budget_s':>8} {'total_s':>8}  command")
    for step in build_steps(opts):
        if step.skip_reason:
            print(f"{step.key:<22} {'-':>8} {total:>8.0f}  skipped: {step.skip_reason}")
            continue
        total += step.budget_s
        fits = "" if total <= args.budget_s else "  (only while time remains)"
        print(f"{step.key:<22} {step.budget_s:>8.0f} {total:>8.0f}  {display_command(step)}{fits}")
    return 0


def _on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = _parse_args(argv)
    if not 0 < args.minutes <= 600:
        print(f"gpu_report: --minutes must be in (0, 600], got {args.minutes}", file=sys.stderr)
        return 2
    args.budget_s = 60.0 * args.minutes
    if args.plan:
        return print_plan(args)
    if args.allow_cpu and not args.quick:
        print("gpu_report: --allow-cpu runs only the --quick smoke version; add --quick", file=sys.stderr)
        return 2
    if not re.fullmatch(r"\d+(,\d+)*", args.streams) or "0" in args.streams.split(","):
        print(
            f"gpu_report: --streams must be comma-separated counts >= 1, got {args.streams!r}",
            file=sys.stderr,
        )
        return 2
    if args.model_dir is not None and not (args.model_dir / "cosyvoice3.yaml").is_file():
        print(
            f"gpu_report: {args.model_dir} is not a CosyVoice3 model directory (no cosyvoice3.yaml)",
            file=sys.stderr,
        )
        return 2
    info = probe_torch()
    cuda = bool(info.get("cuda_available"))
    if not cuda and not args.allow_cpu:
        why = info.get("error") or "torch.cuda.is_available() is False"
        print(
            f"gpu_report: no CUDA GPU ({why}). This report measures a GPU; run it on a machine with CUDA, "
            "or pass --allow-cpu --quick for a CPU smoke run of the steps.",
            file=sys.stderr,
        )
        return 2
    if "error" in info:
        print(f"gpu_report: torch does not load: {info['error']}", file=sys.stderr)
        return 2
    tmp_root = None
    if args.model_dir is None:
        tmp_root = Path(tempfile.mkdtemp(prefix="gpu-report-model-"))
    flow_flag, flow_compare = bench_engine_features()
    opts = Options(
        device="cuda" if cuda else "cpu",
        quick=args.quick,
        model_dir=args.model_dir or tmp_root / "model",
        generate_model=args.model_dir is None,
        preset="tiny" if args.quick else "full",
        streams=args.streams,
        flow_cache_flag=flow_flag,
        flow_cache_compare=flow_compare,
        fail_step=args.fail_step,
    )
    try:
        steps = build_steps(opts)
    except ValueError as exc:
        print(f"gpu_report: {exc}", file=sys.stderr)
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
        return 2
    args.outdir.mkdir(parents=True, exist_ok=True)
    report = report_path(args.outdir, str(info.get("device", "cpu")) if cuda else "cpu", args.quick)
    header = describe(info, opts, args, report)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        print(f"gpu_report: writing {report}", flush=True)
        code = run_all(steps, header, report, args.budget_s, start)
    except (Interrupted, KeyboardInterrupt):
        print(f"gpu_report: interrupted; partial report in {report}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if tmp_root is not None and not args.keep_model:
            shutil.rmtree(tmp_root, ignore_errors=True)
        elif tmp_root is not None:
            print(f"gpu_report: the generated model is kept in {opts.model_dir}")
    print(f"gpu_report: {report} ({'every step ok or skipped' if code == 0 else 'some steps failed'})")
    return code


if __name__ == "__main__":
    sys.exit(main())
