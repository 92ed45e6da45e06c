"""The markdown of scripts/gpu_report.py: header, step summary, bench_engine pivot, one section per step.

Standard library only. ``render`` is called after every change of a step's state, so the file on disk is
always a readable (possibly partial) report.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from scripts.gpu_report_steps import Step, display_command

__all__ = ["engine_rows", "render"]

MAX_OUTPUT_LINES = 120
# A bench_engine.py result row: label, streams, p50_ms, p95_ms, rtf, audio/s, dry_%, batch, peak_MiB.
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|nan|inf)"
_ROW = re.compile(rf"^(\S+)\s+(\d+)((?:\s+{_NUMBER}){{7}})\s*$")
_COLUMNS = ("p50_ms", "p95_ms", "rtf", "audio_per_s", "dry_pct", "batch", "peak_mib")


def engine_rows(output: str) -> list[tuple[str, int, dict[str, float]]]:
    """(engine label, streams, figures) of every result row bench_engine.py printed."""
    rows = []
    for line in output.splitlines():
        match = _ROW.match(line.strip())
        if match and match.group(1) != "engine":
            values = [float(v) for v in match.group(3).split()]
            rows.append((match.group(1), int(match.group(2)), dict(zip(_COLUMNS, values, strict=True))))
    return rows


def _status(step: Step) -> str:
    if step.status == "skipped":
        return f"skipped: {step.skip_reason}"
    if step.status == "ok":
        return f"ok ({step.seconds:.0f} s)"
    if step.status == "failed":
        return f"FAILED (exit {step.returncode}, {step.seconds:.0f} s)"
    if step.status == "timed out":
        return f"TIMED OUT after {step.timeout_s:.0f} s (partial output below)"
    if step.status == "running":
        return f"running (limit {step.timeout_s:.0f} s)"
    return "not run yet"


def _tail(output: str) -> str:
    lines = output.rstrip().splitlines()
    if len(lines) > MAX_OUTPUT_LINES:
        dropped = len(lines) - MAX_OUTPUT_LINES
        lines = [f"... ({dropped} earlier lines in the step's log)", *lines[-MAX_OUTPUT_LINES:]]
    return "\n".join(line.replace("```", "'''") for line in lines)


def _engine_pivot(steps: Sequence[Step]) -> list[str]:
    """Aggregate audio/s and first-chunk p95 per configuration and stream count."""
    table: dict[str, dict[int, dict[str, float]]] = {}
    for step in steps:
        if not step.key.startswith(("engine-", "flow-cache")) or not step.output:
            continue
        for label, streams, row in engine_rows(step.output):
            name = step.key.removeprefix("engine-") + ("" if label == "batched" else f" ({label})")
            table.setdefault(name, {})[streams] = row
    if not table:
        return ["No bench_engine.py rows yet."]
    levels = sorted({n for rows in table.values() for n in rows})
    lines = [
        "Cells: aggregate seconds of audio per second / first-chunk p95 ms (batched engine unless the "
        "row says otherwise; full rows in each step's output).",
        "",
        "| configuration | " + " | ".join(f"streams={n}" for n in levels) + " |",
        "| --- | " + " | ".join("---" for _ in levels) + " |",
    ]
    for name, rows in table.items():
        cells = [
            f"{rows[n]['audio_per_s']:.2f} / {rows[n]['p95_ms']:.0f}" if n in rows else "-" for n in levels
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    ratios = [
        f"- {step.key}: `{line.strip()}`"
        for step in steps
        if step.key.startswith(("engine-", "flow-cache"))
        for line in step.output.splitlines()
        if line.startswith("streams=") and " = " in line
    ]
    return lines + (["", "Ratios the runs printed:", "", *ratios] if ratios else [])


def render(header: dict[str, str], steps: Sequence[Step], state: str) -> str:
    """The whole report as markdown; ``state`` says whether the run is complete."""
    lines = [f"# GPU report: {header['device']}, {header['date']}", ""]
    lines += [f"- **{key}**: {value}" for key, value in header.items()]
    lines += [f"- **report state**: {state}", "", "## Steps", ""]
    lines += ["| step | status | budget s | limit s | note |", "| --- | --- | --- | --- | --- |"]
    for step in steps:
        limit = f"{step.timeout_s:.0f}" if step.timeout_s else "-"
        budget = "-" if step.skip_reason else f"{step.budget_s:.0f}"
        lines.append(f"| [{step.title}](#{step.key}) | {_status(step)} | {budget} | {limit} | {step.note or '-'} |")
    lines += ["", "## bench_engine summary", "", *_engine_pivot(steps), ""]
    goals = [f"- {s.key}: `{line.strip()}`" for s in steps for line in s.output.splitlines() if line.startswith("load ")]
    if goals:
        lines += ["Poisson runs (sentence first chunk against the lone one, mid-stream underruns):", "", *goals, ""]
    for step in steps:
        lines += [f'<a id="{step.key}"></a>', f"## {step.title}", ""]
        lines += [f"- command: `{display_command(step)}`", f"- status: {_status(step)}"]
        if step.note:
            lines.append(f"- note: {step.note}")
        if step.output.strip():
            lines += ["", "```text", _tail(step.output), "```"]
        lines.append("")
    return "\n".join(lines)
