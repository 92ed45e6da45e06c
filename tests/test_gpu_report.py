"""scripts/gpu_report.py: a CPU smoke run writes every section, failures are recorded, no GPU is refused.

The report's steps run in subprocesses here with the web stack (and the other packages the GPU machine
lacks) made unimportable by a ``sitecustomize`` on ``PYTHONPATH``, and with ``CUDA_VISIBLE_DEVICES`` empty so
a machine with a GPU takes the same CPU path.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.gpu_report import bench_engine_features, flow_cache_features, run_step, step_timeout
from scripts.gpu_report_markdown import engine_rows
from scripts.gpu_report_steps import Options, Step, build_steps

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO_ROOT / "scripts" / "gpu_report.py")
# Installed here for the gateway and the tests, absent on the GPU machine (torch, onnxruntime, tokenizers,
# safetensors, transformers and their dependencies only).
NOT_ON_GPU_MACHINE = (
    "fastapi", "uvicorn", "httpx", "rich", "pydantic", "starlette", "websockets", "aiohttp", "onnx", "scipy",
    "soundfile", "librosa", "funasr", "modelscope", "opuslib_next",
)  # fmt: skip
# ``None`` in sys.modules: ``import x`` raises ModuleNotFoundError and ``importlib.util.find_spec(x)`` is
# None, as for a package that is not installed (torch._dynamo probes optional packages with find_spec).
BLOCKER = f"""
import sys

for _name in {NOT_ON_GPU_MACHINE!r}:
    sys.modules[_name] = None
"""


def _env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, CUDA_VISIBLE_DEVICES="")


def _run(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, SCRIPT, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _section(report: str, key: str) -> str:
    start = report.index(f'<a id="{key}"></a>')
    end = report.find("<a id=", start + 1)
    return report[start : end if end > 0 else None]


def test_the_blocker_really_blocks(tmp_path: Path) -> None:
    code = "import fastapi"
    done = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True)
    assert done.returncode != 0 and "ModuleNotFoundError: import of fastapi halted" in done.stderr


def test_cpu_quick_run_writes_every_section_and_survives_a_failing_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _run([str(out), "--allow-cpu", "--quick", "--fail-step", "first-chunk-bfloat16"], _env(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr  # 1: a step failed (the injected one)
    [report_file] = out.glob("*.md")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-cpu-quick\.md", report_file.name)
    report = report_file.read_text(encoding="utf-8")
    for field in ("device", "date", "torch / CUDA runtime / cuDNN", "git commit", "model", "packages"):
        assert f"- **{field}**: " in report
    assert "report state**: complete; failed or timed out: first-chunk-bfloat16" in report

    status = {key: _section(report, key) for key in re.findall(r'<a id="([^"]+)"></a>', report)}
    assert set(status) == {
        "model", "first-chunk-bfloat16", "first-chunk-float32", "engine-cache-on", "engine-cache-off",
        "engine-one-at-a-time", "flow-cache-compare", "precision", "activations", "memory-plan",
        "engine-cuda-graphs", "engine-torch-compile",
    }  # fmt: skip
    for key, section in status.items():
        assert "- command: `python " in section, key
    # The injected failure is recorded with its exit status and output; every step after it still ran.
    assert "- status: FAILED (exit 3" in status["first-chunk-bfloat16"]
    assert "injected failure" in status["first-chunk-bfloat16"]
    for key in ("model", "first-chunk-float32", "engine-cache-on", "engine-one-at-a-time", "precision",
                "activations", "memory-plan"):  # fmt: skip
        assert "- status: ok (" in status[key], status[key]
    for key in (
        "engine-cache-off",
        "flow-cache-compare",
    ):  # ran, or skipped because bench_engine lacks the flag
        assert (
            "- status: ok (" in status[key]
            or "- status: skipped: bench_engine.py has no --flow-cache" in status[key]
        )
    # What needs CUDA is skipped with its reason, not missing.
    assert "- status: skipped: CUDA graphs need a CUDA device" in status["engine-cuda-graphs"]
    assert "max_memory_allocated: skipped" in status["memory-plan"]
    assert "- status: skipped: " in status["engine-torch-compile"]
    # The tables themselves are in the report: per-stage timing, engine rows, precision, plan.
    assert "first-chunk latency:" in status["first-chunk-float32"]
    assert {(label, n) for label, n, _ in engine_rows(status["engine-one-at-a-time"])} == {
        ("batched", 1), ("batched", 2), ("one-at-1", 1), ("one-at-1", 2)
    }  # fmt: skip
    assert re.search(r"^bfloat16\s+\d", status["precision"], re.MULTILINE)
    assert "planned total" in status["memory-plan"]
    assert re.search(r"^\| cache-on \| [\d.]+ / \d+ \| [\d.]+ / \d+ \|$", report, re.MULTILINE)
    assert (report_file.with_suffix(".logs") / "precision.log").is_file()


def test_without_cuda_it_refuses_with_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _run([str(out)], _env(tmp_path), timeout=120)
    assert done.returncode == 2
    assert "no CUDA GPU" in done.stderr and "--allow-cpu --quick" in done.stderr
    assert not out.exists()  # nothing written
    done = _run(
        [str(out), "--allow-cpu"], _env(tmp_path), timeout=120
    )  # a full run on the CPU is not offered
    assert done.returncode == 2 and "--quick" in done.stderr


def test_the_driver_imports_only_the_standard_library(tmp_path: Path) -> None:
    code = (
        "import sys; before = set(sys.modules); import scripts.gpu_report; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(m for m in new if m not in sys.stdlib_module_names and m != 'scripts'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=_env(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_step_past_its_limit_is_killed_and_keeps_its_output(tmp_path: Path) -> None:
    step = Step(
        "slow", "a slow step", None, ["-c", "print('partial', flush=True); import time; time.sleep(60)"]
    )
    start = time.perf_counter()
    run_step(step, tmp_path / "slow.log", timeout=2.0)
    assert step.status == "timed out" and "partial" in step.output
    assert time.perf_counter() - start < 30


def test_time_left_is_shared_by_weight_and_a_step_without_enough_is_skipped() -> None:
    steps = [Step("a", "a", None, weight=1.0, min_s=10), Step("b", "b", None, weight=3.0, min_s=10)]
    assert step_timeout(steps[0], steps, 400.0) == pytest.approx(100.0)
    assert step_timeout(steps[0], steps, 20.0) == pytest.approx(10.0)  # the minimum, when there is that much
    assert step_timeout(steps[0], steps, 5.0) is None
    steps[0].status = "ok"
    assert step_timeout(steps[1], steps, 300.0) == pytest.approx(300.0)  # the last pending step gets it all


def test_flow_cache_runs_follow_what_bench_engine_offers() -> None:
    assert flow_cache_features("  --flow-cache {on,off,compare}\n") == (True, True)
    assert flow_cache_features("  --flow-cache {on,off}  cache the DiT's state\n") == (True, False)
    assert flow_cache_features("  --cuda-graphs\n  --torch-compile\n") == (False, False)


def _plan(flag: bool, compare: bool) -> dict[str, Step]:
    opts = Options(
        device="cuda", quick=False, model_dir=Path("/m"), generate_model=True, preset="full",
        flow_cache_flag=flag, flow_cache_compare=compare,
    )  # fmt: skip
    return {step.key: step for step in build_steps(opts)}


def test_the_full_plan_runs_the_grid_with_the_flow_cache_on_and_off_when_bench_engine_has_it() -> None:
    steps = _plan(flag=True, compare=True)
    assert all(step.skip_reason is None for step in steps.values())
    for key, mode in (("engine-cache-on", "on"), ("engine-cache-off", "off"), ("engine-cuda-graphs", "on")):
        args = " ".join(steps[key].args)
        assert (
            f"--flow-cache {mode}" in args
            and "--streams 1,4,8,16,32,64" in args
            and "--dtype bfloat16" in args
        )
    assert "--torch-compile" in steps["engine-torch-compile"].args
    assert "--cuda-graphs" in steps["engine-cuda-graphs"].args
    compare = " ".join(steps["flow-cache-compare"].args)
    for part in ("--flow-cache compare", "--streams 8", "--sentences 4", "--prompt-seconds 8"):
        assert part in compare  # the workload
    assert "--preset full" in " ".join(steps["model"].args)


def test_without_the_flag_the_cache_off_runs_are_skipped_and_the_rest_use_the_default() -> None:
    steps = _plan(flag=False, compare=False)
    assert "--flow-cache" in (steps["engine-cache-off"].skip_reason or "")
    assert "--flow-cache" in (steps["flow-cache-compare"].skip_reason or "")
    for key in ("engine-cache-on", "engine-one-at-a-time", "engine-cuda-graphs", "engine-torch-compile"):
        assert steps[key].skip_reason is None and "--flow-cache" not in steps[key].args


def test_sigterm_leaves_a_partial_report_that_says_so(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [sys.executable, SCRIPT, str(out), "--allow-cpu", "--quick"]
    proc = subprocess.Popen(args, cwd=REPO_ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the model step is done and the next one runs
            reports = list(out.glob("*.md"))
            if reports and "- status: ok (" in _section(reports[0].read_text(encoding="utf-8"), "model"):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    report = reports[0].read_text(encoding="utf-8")
    assert "- **report state**: interrupted" in report
    assert "- status: ok (" in _section(report, "model")
    assert "- status: not run yet" in _section(report, "memory-plan")


@pytest.mark.parametrize("quick", [False, True])
def test_every_planned_command_parses_with_its_script(quick: bool) -> None:

    flag, compare = bench_engine_features()
    opts = Options(
        device="cuda", quick=quick, model_dir=Path("/m"), generate_model=True, preset="tiny" if quick else "full",
        flow_cache_flag=flag, flow_cache_compare=compare,
    )  # fmt: skip
    checked = set()
    for step in build_steps(opts):
        if step.skip_reason or step.script == "scripts/make_tiny_model.py":
            continue
        module = importlib.import_module(step.script.removesuffix(".py").replace("/", "."))
        module._parse_args(step.args)  # argparse exits (SystemExit) on an unknown or malformed flag
        checked.add(step.script)
    assert checked == {
        "scripts/bench_cosyvoice.py", "scripts/bench_engine.py", "scripts/check_precision.py",
        "scripts/measure_activations.py", "scripts/gpu_report_memory.py",
    }  # fmt: skip
