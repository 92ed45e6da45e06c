"""Run the CosyVoice3 parity fixture cases through our implementation.

    python scripts/parity.py FIXTURE_DIR OUT.safetensors [--only KIND[,KIND]] [--case NAME[,NAME]]

Reads ``FIXTURE_DIR/cases.json`` and ``FIXTURE_DIR/inputs.safetensors`` (never the expected outputs),
loads the model from ``FIXTURE_DIR/model``, calls the handler registered for each case's kind (see
``scripts/parity_cases``) and writes every returned tensor as ``<case>.<output>`` to OUT. Prints
one status line per case; exits 1 if any selected case had no handler, raised, or left an output out.

MKL runs in its reproducible mode (``MKL_CBWR=COMPATIBLE``, unless set): its CPU-specific kernels
round differently, and the vocoder amplifies that past the token2wav tolerance on some CPUs
(tests/conftest.py says more).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("MKL_CBWR", "COMPATIBLE")  # before torch loads MKL
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from scripts.parity_cases import ParityContext, discover_handlers  # noqa: E402


def _split_names(values: list[str] | None) -> set[str] | None:
    if not values:
        return None
    return {name.strip() for value in values for name in value.split(",") if name.strip()}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixture_dir", type=Path, help="a v3-* fixture set (cases.json, inputs, model/)")
    parser.add_argument("out", type=Path, help="where to write the computed outputs (.safetensors)")
    parser.add_argument("--only", action="append", help="run only these case kinds (comma-separated)")
    parser.add_argument("--case", action="append", help="run only these case names (comma-separated)")
    parser.add_argument("--device", default="cpu", help="torch device for the handlers (default cpu)")
    return parser.parse_args(argv)


def _case_inputs(case: dict, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    missing = [name for name in case.get("inputs", {}) if f"{case['name']}.{name}" not in inputs]
    if missing:
        raise KeyError(f"inputs.safetensors lacks {', '.join(missing)}")
    return {name: inputs[f"{case['name']}.{name}"] for name in case.get("inputs", {})}


def _expected_names(case: dict) -> list[str]:
    return list(case.get("outputs", {}))


def run(fixture_dir: Path, out: Path, *, kinds: set[str] | None, names: set[str] | None, device: str) -> int:
    cases_path = fixture_dir / "cases.json"
    spec = json.loads(cases_path.read_text(encoding="utf-8"))
    cases = [
        case
        for case in spec["cases"]
        if (kinds is None or case["kind"] in kinds) and (names is None or case["name"] in names)
    ]
    unknown = (names or set()) - {case["name"] for case in spec["cases"]}
    if unknown:
        print(f"unknown case names: {', '.join(sorted(unknown))}")
    if not cases:
        print("no case selected")
        return 1
    inputs = load_file(str(fixture_dir / "inputs.safetensors"))
    ctx = ParityContext(
        model_dir=fixture_dir / spec.get("model_dir", "model"),
        fixture_dir=fixture_dir,
        device=torch.device(device),
    )
    # the reference ran on CPU in full fp32; keep CUDA from silently using TF32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    handlers, import_errors = discover_handlers()
    for module, error in import_errors.items():
        print(f"IMPORT-ERROR {module}: {error}")

    results: dict[str, torch.Tensor] = {}
    counts = {"ok": 0, "skipped": 0, "failed": 0}
    for case in cases:
        name, kind = case["name"], case["kind"]
        handler = handlers.get(kind)
        if handler is None:
            print(f"SKIP {name} [{kind}]: no handler for this kind")
            counts["skipped"] += 1
            continue
        started = time.perf_counter()
        try:
            outputs = handler(ctx, case, _case_inputs(case, inputs))
            if not isinstance(outputs, dict) or not all(
                isinstance(v, torch.Tensor) for v in outputs.values()
            ):
                raise TypeError("handler must return a dict of tensors")
        except Exception as exc:
            print(f"FAIL {name} [{kind}]: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stdout)
            counts["failed"] += 1
            continue
        for key, value in outputs.items():
            results[f"{name}.{key}"] = value.detach().to("cpu").contiguous().clone()
        left_out = [key for key in _expected_names(case) if key not in outputs]
        seconds = time.perf_counter() - started
        if left_out:
            print(f"FAIL {name} [{kind}]: outputs left out: {', '.join(left_out)} ({seconds:.2f} s)")
            counts["failed"] += 1
        else:
            print(f"OK {name} [{kind}] ({seconds:.2f} s)")
            counts["ok"] += 1

    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(results, str(out))
    print(f"{counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped; wrote {out}")
    return 0 if counts["failed"] == 0 and counts["skipped"] == 0 and not unknown else 1


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if not (args.fixture_dir / "cases.json").is_file():
        print(f"{args.fixture_dir}: no cases.json here", file=sys.stderr)
        return 2
    return run(
        args.fixture_dir,
        args.out,
        kinds=_split_names(args.only),
        names=_split_names(args.case),
        device=args.device,
    )


if __name__ == "__main__":
    sys.exit(main())
