"""The machine facts of scripts/gpu_report.py, read without importing torch here: torch, CUDA and the first
device (a subprocess), nvidia-smi, the git commit, package versions, what this checkout's bench_engine.py
offers, and the report's header made from them. Standard library only, as the driver."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from scripts.gpu_report_steps import Options

REPO_ROOT = Path(__file__).resolve().parents[1]

__all__ = ["bench_engine_features", "describe", "flow_cache_features", "probe_torch"]

PACKAGES = ("torch", "onnxruntime", "tokenizers", "safetensors", "transformers", "numpy")
PROBE = """
import json, platform, torch
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
        "cuda_available": torch.cuda.is_available()}
if info["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    info.update(device=p.name, count=torch.cuda.device_count(), total_gib=round(p.total_memory / 2**30, 1),
                capability=f"{p.major}.{p.minor}", cudnn=torch.backends.cudnn.version())
print(json.dumps(info))
"""
PROBE_TIMEOUT_S = 180.0


def run_text(argv: list[str], timeout: float) -> str:
    """A command's output, or why there is none."""
    try:
        done = subprocess.run(
            argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable ({exc.__class__.__name__})"
    return done.stdout.strip() if done.returncode == 0 else f"unavailable (exit {done.returncode})"


def probe_torch() -> dict[str, object]:
    """torch, CUDA and the first device, read in a subprocess (this process never imports torch)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"the torch probe took over {PROBE_TIMEOUT_S:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["torch probe failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def flow_cache_features(help_text: str) -> tuple[bool, bool]:
    """Whether bench_engine.py's ``--help`` offers ``--flow-cache`` and its ``compare`` mode."""
    flag = re.search(r"--flow-cache\b", help_text) is not None
    compare = re.search(r"--flow-cache[^\n]*\bcompare\b|\{[^}]*\bcompare\b[^}]*\}", help_text) is not None
    return flag, flag and compare


def bench_engine_features() -> tuple[bool, bool]:
    """:func:`flow_cache_features` of the bench_engine.py in this checkout."""
    script = str(REPO_ROOT / "scripts" / "bench_engine.py")
    return flow_cache_features(run_text([sys.executable, script, "--help"], PROBE_TIMEOUT_S))


def describe(
    info: dict[str, object], opts: Options, args: argparse.Namespace, report: Path
) -> dict[str, str]:
    cuda = opts.device == "cuda"
    smi = "unavailable (no nvidia-smi)"
    if shutil.which("nvidia-smi"):
        smi = run_text(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], 30
        ).replace("\n", "; ")
    git = run_text(["git", "rev-parse", "HEAD"], 10)
    status = run_text(["git", "status", "--porcelain", "--untracked-files=no"], 10)
    if not git.startswith("unavailable") and not status.startswith("unavailable"):
        changed = len(status.splitlines())
        git += f" ({changed} tracked files changed)" if changed else " (clean)"
    packages = []
    for name in PACKAGES:
        try:
            packages.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            packages.append(f"{name} (not installed)")
    if cuda:
        device = f"{info['device']} (x{info['count']}, {info['total_gib']} GiB, compute capability {info['capability']})"
    else:
        device = "CPU (no CUDA device)"
    if opts.generate_model:
        model = (
            f"random weights, {opts.preset}-preset architecture (scripts/make_tiny_model.py --preset "
            f"{opts.preset} --seed 0), written to {opts.model_dir}"
        )
    else:
        model = f"the model directory {opts.model_dir}"
    mode = "full" if not opts.quick else "quick smoke run (tiny preset, 1-2 streams, few tokens)"
    if not cuda:
        mode += " on the CPU (--allow-cpu): not a GPU measurement"
    return {
        "device": device,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": mode,
        "nvidia-smi (name, driver, memory)": smi,
        "torch / CUDA runtime / cuDNN": f"{info.get('torch')} / {info.get('cuda_runtime')} / {info.get('cudnn', '-')}",
        "python": str(info.get("python")),
        "packages": ", ".join(packages),
        "git commit": git,
        "model": model,
        "flow cache in bench_engine.py": (
            ("--flow-cache on|off" + (" and compare" if opts.flow_cache_compare else ""))
            if opts.flow_cache_flag
            else "not available (no --flow-cache flag)"
        ),
        "time budget": f"{args.minutes:g} min ({args.budget_s:.0f} s), model generation included",
        "command": shlex.join(["python", "scripts/gpu_report.py", *sys.argv[1:]]),
        "full logs": str(report.with_suffix(".logs")),
    }
