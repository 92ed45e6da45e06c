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


def test_bench_engine_prints_a_row_per_engine_and_the_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--streams", "2", "--tokens-per-sentence", "30", "--sentences", "1", "--threads", "1",
        "--max-lead-s", "0.5", "--model-dir", str(tmp_path / "tiny"), "--max-hop-rows", "1",
    ]  # fmt: skip
    threads = torch.get_num_threads()
    try:
        assert bench_engine.main(argv) == 0
    finally:
        torch.set_num_threads(threads)  # the script sets the process-wide count
    lines = capsys.readouterr().out.splitlines()
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


def test_flow_cache_compare_prints_interleaved_rounds_and_the_ratio_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--streams", "2", "--tokens-per-sentence", "30", "--sentences", "2", "--threads", "1",
        "--max-lead-s", "0.5", "--model-dir", str(tmp_path / "tiny"), "--prompt-seconds", "2",
        "--flow-cache", "compare", "--compare-repeats", "2",
    ]  # fmt: skip
    threads = torch.get_num_threads()
    try:
        assert bench_engine.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
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
