"""The engine benchmark runs end to end on a tiny model and prints every figure it promises."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from scripts import bench_engine

COLUMNS = ["engine", "streams", "p50_ms", "p95_ms", "rtf", "audio/s", "dry_%", "batch", "peak_MiB"]


def _run_bench(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """``bench_engine.main(argv)`` (it must exit 0); its stdout's lines."""
    threads = torch.get_num_threads()
    try:
        assert bench_engine.main(argv) == 0
    finally:
        torch.set_num_threads(threads)  # the script sets the process-wide count
    return capsys.readouterr().out.splitlines()


def test_bench_engine_prints_a_row_per_engine_and_the_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--streams", "2", "--tokens-per-sentence", "30", "--sentences", "1", "--threads", "1",
        "--max-lead-s", "0.5", "--model-dir", str(tmp_path / "tiny"), "--max-hop-rows", "1",
    ]  # fmt: skip
    lines = _run_bench(argv, capsys)
    header = next(line for line in lines if line.startswith("engine"))
    assert header.split() == COLUMNS
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in (["batched"], ["one-at-1"])}
    assert set(rows) == {"batched", "one-at-1"}
    for row in rows.values():
        assert row[1] == "2" and len(row) == len(COLUMNS)
        first_p50, first_p95, rtf, audio_per_s, dry, batch, peak = map(float, row[2:])
        assert 0 < first_p50 <= first_p95 and rtf > 0 and audio_per_s > 0 and 0 <= dry <= 100 and peak > 0
    assert float(rows["one-at-1"][7]) == 1.0  # the baseline really serves one request per step
    assert re.search(r"streams=2: aggregate audio/s batched / one-at-a-time = \d+\.\d\dx", "\n".join(lines))


def test_poisson_rows_take_the_lone_first_chunk_measured_around_their_own_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--arrivals", "poisson", "--load", "0.4,0.8", "--replies", "1", "--streams", "2", "--capacity", "4",
        "--threads", "1", "--model-dir", str(tmp_path / "tiny"), "--prompt-seconds", "2", "--lone-sentences", "2",
        "--seed", "9",  # its two replies (one a load) have 17 s of audio, played at real time
    ]  # fmt: skip
    lines = _run_bench(argv, capsys)
    assert "lone=bracket" in lines[0]
    assert "(median of 2 sentences alone;" in "\n".join(lines)
    header = next(line.split() for line in lines if line.split()[:1] == ["load"])
    rows = [dict(zip(header, map(float, line.split()), strict=True)) for line in lines if re.match(r" 0\.[48]0 ", line)]
    brackets = [re.search(r"before / after this load: (\d+) / (\d+) ms", line) for line in lines]
    pairs = [(float(m[1]), float(m[2])) for m in brackets if m]
    assert [row["load"] for row in rows] == [0.4, 0.8] and len(pairs) == 2
    assert pairs[0][1] == pairs[1][0]  # the lone chunks after one load are the next one's before
    for row, (before, after) in zip(rows, pairs, strict=True):
        assert abs(row["lone_ms"] - (before + after) / 2) <= 1  # printed rounded to the ms
        assert row["p95_x_lone"] == pytest.approx(row["first_p95_ms"] / row["lone_ms"], rel=0.02, abs=0.01)


def test_flow_cache_compare_prints_interleaved_rounds_and_the_ratio_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--streams", "2", "--tokens-per-sentence", "30", "--sentences", "2", "--threads", "1",
        "--max-lead-s", "0.5", "--model-dir", str(tmp_path / "tiny"), "--prompt-seconds", "2",
        "--flow-cache", "compare", "--compare-repeats", "2",
    ]  # fmt: skip
    lines = _run_bench(argv, capsys)
    labels = [line.split()[0] for line in lines if line.split()[:1] in (["cache-on"], ["cache-off"], ["cap-on"], ["cap-off"])]
    assert labels == ["cache-on", "cache-off", "cap-on", "cap-off"] * 2  # interleaved rounds
    assert re.search(
        r"streams=2: flow cache on / off aggregate audio/s = \d+\.\d\dx; first-chunk p95 off / on = \d+\.\d\dx",
        "\n".join(lines),
    )


class _StallingEngine:
    """Stands in for a TTSEngine: 0.1 s chunks, the first after 20 ms, then a 0.6 s stall mid-sentence."""

    def __init__(self) -> None:
        self.delays = [0.02, 0.0, 0.6, 0.0]

    async def synthesize(self, text: str, *, voice: str, output_rate: int):  # noqa: ANN201
        for delay in self.delays:
            await asyncio.sleep(delay)
            yield np.zeros(output_rate // 10, np.int16)


async def test_first_chunk_latency_is_the_first_chunks_arrival_whatever_stalls_later() -> None:
    args = bench_engine._parse_args(["--sentences", "1", "--rate", "16000"])
    start = time.perf_counter()
    result = await bench_engine.one_stream(_StallingEngine(), args, start, "v", paced=True)  # type: ignore[arg-type]
    assert result.ran_dry  # the stall outlasted the 0.2 s received before it
    assert result.first_chunk_s < 0.2  # not moved by the stall (moved by it, it would read 0.42 s)
    assert abs(result.audio_s - 0.4) < 1e-9
