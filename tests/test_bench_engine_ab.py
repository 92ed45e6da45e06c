"""The paired A/B benchmark (scripts/bench_engine_ab.py) runs end to end on a tiny model: every variant
runs every round's replies, in alternating order, and a setting the step does not have is refused."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

from scripts import bench_engine_ab


def test_a_variant_is_a_name_and_typed_settings() -> None:
    assert bench_engine_ab.parse_variant("new=urgent_closing_pauses:true,decode_burst:16") == (
        "new",
        {"urgent_closing_pauses": True, "decode_burst": 16},
    )
    assert bench_engine_ab.parse_variant("x=rows_cost:False,margin:2.5") == ("x", {"rows_cost": False, "margin": 2.5})
    for bad in ("no-equals", "=a:1", "n=a", "n=a:maybe"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_engine_ab.parse_variant(bad)


def _main(argv: list[str]) -> int:
    threads = torch.get_num_threads()
    try:
        return bench_engine_ab.main(argv)
    finally:
        torch.set_num_threads(threads)  # the script sets the process-wide count


def test_every_variant_runs_every_rounds_replies_in_alternating_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--rounds", "2", "--replies", "1", "--warm", "0", "--load", "0.8", "--capacity", "4", "--streams", "2",
        "--seed", "129",  # rounds of one short sentence each (2.5 s of audio in both)
        "--model-dir", str(tmp_path / "tiny"),
        "--variant", "off=urgent_closing_pauses:false", "--variant", "on=urgent_closing_pauses:true",
    ]  # fmt: skip
    assert _main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    runs = [re.match(r"round (\d) load 0.8 (\w+): p95 \d+ ms", line) for line in lines]
    assert [(m[1], m[2]) for m in runs if m] == [("0", "off"), ("0", "on"), ("1", "on"), ("1", "off")]
    pooled = {
        m[1]: (int(m[2]), int(m[3]))
        for m in (re.match(r"pooled load 0.8 (\w+): sentences (\d+) .* lowest p95 in (\d) of 2 rounds", x) for x in lines)
        if m
    }
    assert set(pooled) == {"off", "on"}
    assert pooled["off"][0] == pooled["on"][0] > 0  # the same replies for both
    assert pooled["off"][1] + pooled["on"][1] == 2  # one winner a round


def test_a_setting_the_step_does_not_have_is_refused(tmp_path: Path) -> None:
    argv = ["--model-dir", str(tmp_path / "tiny"), "--variant", "a=decode_burst:8", "--variant", "b=no_such_knob:true"]
    with pytest.raises(SystemExit, match="no bool, int or float setting 'no_such_knob'"):
        _main(argv)
    with pytest.raises(SystemExit):  # one variant is no comparison
        bench_engine_ab._args(["--variant", "a=decode_burst:8"])
