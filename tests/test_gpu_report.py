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
from scripts.gpu_report_steps import CORE_STEPS, Options, Step, build_steps

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO_ROOT / "scripts" / "gpu_report.py")
# Installed here for the gateway and the tests, absent on the GPU machine (torch, onnxruntime, tokenizers,
# safetensors, transformers and their dependencies only).
NOT_ON_GPU_MACHINE = (
    "fastapi", "uvicorn", "httpx", "rich", "pydantic", "starlette", "websockets", "aiohttp", "onnx", "scipy",
    "soundfile", "librosa", "funasr", "modelscope", "opuslib_next", "soxr", "wetext", "prometheus_client",
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
    started = time.perf_counter()
    done = _run(
        [str(out), "--allow-cpu", "--quick", "--minutes", "8", "--fail-step", "first-chunk-float32"],
        _env(tmp_path), timeout=480,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # 1: a step failed (the injected one)
    assert time.perf_counter() - started < 8 * 60  # the run's own budget
    [report_file] = out.glob("*.md")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-cpu-quick\.md", report_file.name)
    report = report_file.read_text(encoding="utf-8")
    for field in ("device", "date", "torch / CUDA runtime / cuDNN", "git commit", "model", "packages"):
        assert f"- **{field}**: " in report
    assert "- **time budget**: 8 min (480 s, used " in report
    assert "report state**: complete; failed or timed out: first-chunk-float32" in report

    keys = re.findall(r'<a id="([^"]+)"></a>', report)
    assert keys[: len(CORE_STEPS)] == list(CORE_STEPS)  # in order of value
    status = {key: _section(report, key) for key in keys}
    assert set(status) == {
        *CORE_STEPS, "poisson-rows-cost", "poisson-together", "first-chunk-float32", "precision",
        "engine-cache-off", "engine-one-at-a-time", "flow-cache-compare", "activations", "engine-torch-compile",
    }  # fmt: skip
    for key, section in status.items():
        assert "- command: `python " in section, key
    # The injected failure is recorded with its exit status and output; every step after it still ran.
    assert "- status: FAILED (exit 3" in status["first-chunk-float32"]
    assert "injected failure" in status["first-chunk-float32"]
    for key in (*CORE_STEPS, "poisson-rows-cost", "poisson-together", "precision", "engine-cache-off", "engine-one-at-a-time",
                "flow-cache-compare", "activations"):  # fmt: skip
        assert "- status: ok (" in status[key], status[key]
    # What needs CUDA is skipped with its reason, or said in its note, not missing.
    assert "- status: skipped: " in status["engine-torch-compile"]
    assert "max_memory_allocated: skipped" in status["memory-plan"]
    assert "without CUDA graphs" in status["engine-grid"]
    # The tables themselves are in the report: facts, per-stage timing, engine rows, Poisson, precision, plan.
    assert '"torch": ' in status["facts"] and '"cpus": ' in status["facts"]
    assert "first-chunk latency:" in status["first-chunk-bfloat16"]
    assert {(label, n) for label, n, _ in engine_rows(status["engine-grid"])} == {("batched", 1), ("batched", 2)}
    assert {(label, n) for label, n, _ in engine_rows(status["engine-one-at-a-time"])} == {
        ("batched", 1), ("batched", 2), ("one-at-1", 1), ("one-at-1", 2)
    }  # fmt: skip
    for key in ("poisson", "poisson-rows-cost", "poisson-together"):
        assert re.search(r"^ 0\.60 +\d+ ", status[key], re.MULTILINE) and re.search(r"^ 0\.90 +\d+ ", status[key], re.MULTILINE)
    assert "step_order=together" in status["poisson-together"] and "step_order=slack" in status["poisson"]
    assert "rows_cost=on" in status["poisson-rows-cost"] and "rows_cost=auto" in status["poisson"]
    # the slack run explains its slowest first chunks: where the wait went, by kind of call
    assert re.search(r"^  slow first chunk \(reply \d+, sentence \d+\): \d+ ms: \d+ steps", status["poisson"], re.MULTILINE)
    assert "slow first chunk" not in status["poisson-together"]
    assert re.search(r"^- poisson: `load 0\.6: sentence first-chunk p95 = ", report, re.MULTILINE)
    assert re.search(r"^bfloat16\s+\d", status["precision"], re.MULTILINE)
    assert "planned total" in status["memory-plan"]
    assert re.search(r"^\| grid \| [\d.]+ / \d+ \| [\d.]+ / \d+ \|$", report, re.MULTILINE)
    assert re.search(r"^\| \[machine facts\]\(#facts\) \| ok \(\d+ s\) \| 15 \| \d+ \|", report, re.MULTILINE)
    assert (report_file.with_suffix(".logs") / "precision.log").is_file()


def test_the_8_minute_plan_puts_the_core_steps_first_within_the_budget() -> None:
    done = subprocess.run(
        [sys.executable, SCRIPT, "out", "--plan"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [row[0] for row in rows[: len(CORE_STEPS)]] == list(CORE_STEPS)
    core_total = float(rows[len(CORE_STEPS) - 1][2])
    assert core_total <= 8 * 60 - 20  # the driver's own probes fit in what is left
    assert all("only while time remains" in " ".join(row) for row in rows[len(CORE_STEPS) :])
    poisson = " ".join(rows[CORE_STEPS.index("poisson")])
    assert "--arrivals poisson --load 0.6,0.9" in poisson and "--cuda-graphs" in poisson
    assert "--lone start" in poisson  # 12 lone sentences after every load would not fit the step's budget
    grid = " ".join(rows[CORE_STEPS.index("engine-grid")])
    assert "--streams 1,4,16,64" in grid and "--cuda-graphs" in grid and "--dtype bfloat16" in grid


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


def test_a_step_gets_its_budget_or_what_is_left_and_is_skipped_below_its_minimum() -> None:
    step = Step("a", "a", None, budget_s=100.0, min_s=10)
    assert step_timeout(step, 400.0) == pytest.approx(100.0)  # its own budget
    assert step_timeout(step, 40.0) == pytest.approx(40.0)  # what is left of the run
    assert step_timeout(step, 5.0) is None  # less than its minimum: skipped


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
    for key, mode in (("engine-grid", "on"), ("engine-cache-off", "off")):
        args = " ".join(steps[key].args)
        assert f"--flow-cache {mode}" in args and "--streams 1,4,16,64" in args and "--dtype bfloat16" in args
        assert "--cuda-graphs" in args
    assert "--torch-compile" in steps["engine-torch-compile"].args
    compare = " ".join(steps["flow-cache-compare"].args)
    for part in ("--flow-cache compare", "--streams 8", "--sentences 4", "--prompt-seconds 8"):
        assert part in compare  # the workload
    assert "--preset full" in " ".join(steps["model"].args)
    assert "--step-order together" in " ".join(steps["poisson-together"].args)


def test_without_the_flag_the_cache_off_runs_are_skipped_and_the_rest_use_the_default() -> None:
    steps = _plan(flag=False, compare=False)
    assert "--flow-cache" in (steps["engine-cache-off"].skip_reason or "")
    assert "--flow-cache" in (steps["flow-cache-compare"].skip_reason or "")
    for key in ("engine-grid", "engine-one-at-a-time", "engine-torch-compile"):
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
    assert "- status: not run yet" in _section(report, "activations")


@pytest.mark.parametrize("quick", [False, True])
def test_every_planned_command_parses_with_its_script(quick: bool) -> None:

    flag, compare = bench_engine_features()
    opts = Options(
        device="cuda", quick=quick, model_dir=Path("/m"), generate_model=True, preset="tiny" if quick else "full",
        flow_cache_flag=flag, flow_cache_compare=compare,
    )  # fmt: skip
    checked = set()
    for step in build_steps(opts):
        if step.skip_reason or step.script in (None, "scripts/make_tiny_model.py"):
            continue
        module = importlib.import_module(step.script.removesuffix(".py").replace("/", "."))
        module._parse_args(step.args)  # argparse exits (SystemExit) on an unknown or malformed flag
        checked.add(step.script)
    assert checked == {
        "scripts/bench_cosyvoice.py", "scripts/bench_engine.py", "scripts/check_precision.py",
        "scripts/measure_activations.py", "scripts/gpu_report_memory.py",
    }  # fmt: skip
