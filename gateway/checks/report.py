"""`python -m gateway check`: run the model checks and print them as a table (or JSON)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import warnings
from typing import TextIO

from rich.console import Console
from rich.table import Table

from gateway.checks.model import FAILED, MISSING, OK, SKIPPED, CheckResult
from gateway.checks.run import run_checks
from gateway.config import ConfigError, load_config

_STYLES = {OK: "green", MISSING: "yellow", FAILED: "bold red", SKIPPED: "dim"}


def render_table(results: list[CheckResult], out: TextIO, *, verbose: bool = False) -> None:
    console = Console(file=out, width=max(120, Console(file=out).width), soft_wrap=False)
    table = Table(title="gateway check", show_lines=False, expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold")
    table.add_column("fix", overflow="fold")
    for result in results:
        style = _STYLES.get(result.status, "")
        table.add_row(result.name, f"[{style}]{result.status}[/]", result.detail, result.fix)
    console.print(table)
    problems = [r for r in results if r.failed]
    if problems:
        console.print(
            f"[bold red]{len(problems)} problem(s)[/]: fix them in the order listed, then run this again."
        )
    else:
        console.print("[green]all checks passed[/]")
    if verbose:
        for result in results:
            if result.trace:
                console.print(
                    f"\n[bold]{result.name}[/] traceback:\n{result.trace}", markup=False, highlight=False
                )


def render_json(results: list[CheckResult], out: TextIO) -> None:
    body = {"ok": not any(r.failed for r in results), "checks": [r.as_dict() for r in results]}
    out.write(json.dumps(body, ensure_ascii=False, indent=2) + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file (default: config.yaml in the project root)")
    parser.add_argument("--no-synth", action="store_true", help="skip the synthesis / recognition round trip")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--verbose", action="store_true", help="also print the traceback of unexpected errors"
    )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """0 when every check is ok or skipped, 1 when something is missing or failed, 2 for a bad config."""
    out = out or sys.stdout
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:
        warnings.filterwarnings("ignore")  # library warnings would clutter the table
    with contextlib.redirect_stdout(sys.stderr):  # libraries print while loading; stdout is the report's
        results = asyncio.run(run_checks(config, synth=not args.no_synth))
    if args.json:
        render_json(results, out)
    else:
        render_table(results, out, verbose=args.verbose)
    return 1 if any(r.failed for r in results) else 0
