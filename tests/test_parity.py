"""Numeric parity with the official CosyVoice3: every case of every ``v3-*`` fixture set.

The fixture sets live in ``../shared/cosyvoice-parity`` next to the repository (or in the folder
named by ``XZ_PARITY_DIR``). ``scripts/parity.py`` runs once per set, only for the cases this pytest
session selected, and each case's outputs are compared with ``expected.safetensors``:
``|actual - expected| <= atol + rtol * |expected|`` element-wise, shapes equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO_ROOT = Path(__file__).resolve().parents[1]
PARITY_ROOT = Path(os.environ.get("XZ_PARITY_DIR") or REPO_ROOT.parent / "shared" / "cosyvoice-parity")


def _fixture_sets() -> list[Path]:
    if not PARITY_ROOT.is_dir():
        return []
    return sorted(path for path in PARITY_ROOT.glob("v3-*") if (path / "cases.json").is_file())


def _all_cases() -> list:
    params = []
    for fixture_dir in _fixture_sets():
        for case in json.loads((fixture_dir / "cases.json").read_text(encoding="utf-8"))["cases"]:
            params.append(
                pytest.param(fixture_dir, case, id=f"{fixture_dir.name}-{case['kind']}-{case['name']}")
            )
    return params


@dataclass
class ParityRun:
    outputs: dict[str, torch.Tensor] = field(repr=False)
    expected: dict[str, torch.Tensor] = field(repr=False)
    log: str = field(repr=False)

    def log_for(self, case_name: str) -> str:
        lines = [line for line in self.log.splitlines() if case_name in line or "IMPORT-ERROR" in line]
        return "\n".join(lines) or self.log[-4000:]


@pytest.fixture(scope="session")
def parity_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[Path, ParityRun]:
    """One parity.py run per fixture set, limited to the cases selected in this session."""
    selected: dict[Path, list[str]] = {}
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and item.originalname == "test_case_matches_reference":
            selected.setdefault(callspec.params["fixture_dir"], []).append(callspec.params["case"]["name"])
    runs: dict[Path, ParityRun] = {}
    for fixture_dir, names in selected.items():
        out = tmp_path_factory.mktemp("parity") / f"{fixture_dir.name}.safetensors"
        command = [sys.executable, str(REPO_ROOT / "scripts" / "parity.py"), str(fixture_dir), str(out)]
        completed = subprocess.run(
            [*command, "--case", ",".join(names)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        log = completed.stdout + completed.stderr
        runs[fixture_dir] = ParityRun(
            outputs=load_file(str(out)) if out.is_file() else {},
            expected=load_file(str(fixture_dir / "expected.safetensors")),
            log=log,
        )
    return runs


@pytest.mark.parametrize(("fixture_dir", "case"), _all_cases())
def test_case_matches_reference(fixture_dir: Path, case: dict, parity_runs: dict[Path, ParityRun]) -> None:
    run = parity_runs[fixture_dir]
    expected = run.expected
    failures = []
    for output, spec in case["outputs"].items():
        key = f"{case['name']}.{output}"
        if key not in run.outputs:
            failures.append(f"{output}: not produced")
            continue
        actual, reference = run.outputs[key], expected[key]
        if tuple(actual.shape) != tuple(reference.shape):
            failures.append(f"{output}: shape {tuple(actual.shape)} != expected {tuple(reference.shape)}")
            continue
        if not reference.is_floating_point() and actual.is_floating_point():
            failures.append(f"{output}: float output where the reference is {reference.dtype}")
            continue
        error = (actual.double() - reference.double()).abs()
        allowed = spec["atol"] + spec["rtol"] * reference.double().abs()
        bad = error > allowed
        if bad.any():
            worst = int(torch.argmax(error - allowed))
            failures.append(
                f"{output}: {int(bad.sum())}/{bad.numel()} elements out of tolerance "
                f"(max error {error.max().item():.3g}, atol {spec['atol']}, rtol {spec['rtol']}, "
                f"worst flat index {worst})"
            )
    if failures:
        pytest.fail(
            f"{case['name']}:\n  " + "\n  ".join(failures) + "\nrunner log:\n" + run.log_for(case["name"])
        )


@pytest.mark.skipif(not os.environ.get("CI"), reason="outside CI the fixture sets are optional")
def test_ci_has_the_parity_fixtures() -> None:
    """In CI, shared/ sits beside the checkout: parity must run, never silently skip."""
    assert _fixture_sets(), f"no v3-* parity fixture set under {PARITY_ROOT}"
