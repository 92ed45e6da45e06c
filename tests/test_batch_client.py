"""The batch client (``python -m gateway.batch``): a text file as a batch job (progress, results unpacked,
manifest), resume (run again: nothing or only the missing items requested), and against a server without
batch jobs, streams through /v1/audio/speech with bounded concurrency, retrying 429s after Retry-After."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from audio_codecs.wav import read_wav
from gateway.batch import main, parser, run
from gateway.service.accounts import Account, Limits
from tests.api_helpers import fake
from tests.gateway_server import running_gateway
from tests.test_service_limits import add_key

ROOT = Path(__file__).resolve().parent.parent


def texts(path: Path, n: int) -> list[str]:
    lines = [f"Sentence number {i} of the book." + " more" * (i % 3) for i in range(n)]
    path.write_text("\n".join(lines) + "\n\n")  # a blank line is no item
    return lines


async def test_a_text_file_as_a_batch_job_then_a_resume_requests_only_what_is_missing(tmp_path: Path) -> None:
    backend = fake()
    book, out = tmp_path / "book.txt", tmp_path / "out"
    lines = texts(book, 12)
    config = {"batches": {"dir": str(tmp_path / "b"), "scan_s": 0.2}, "cache": {"enabled": False}}
    async with running_gateway(config, backend=backend) as gw, httpx.AsyncClient(timeout=30) as client:
        args = ["--url", gw.url, "--quiet", "--poll-s", "0.1"]
        assert await run(parser().parse_args([str(book), str(out), *args])) == 0
        files = sorted(p.name for p in out.iterdir() if p.suffix == ".wav")
        assert files == [f"line-{n:05d}.wav" for n in range(1, 13)]
        for n, text in enumerate(lines, start=1):
            pcm, _ = read_wav((out / f"line-{n:05d}.wav").read_bytes())
            assert pcm.size == backend.num_samples_for(text)
        manifest = [json.loads(row) for row in (out / "manifest.jsonl").read_text().splitlines()]
        assert [m["status"] for m in manifest] == ["done"] * 12 and not (out / ".batch-job.json").exists()

        opened = backend.num_streams_opened
        assert await run(parser().parse_args([str(book), str(out), *args])) == 0  # all there: nothing asked
        (out / "line-00003.wav").unlink()
        (out / "line-00007.wav").unlink()
        assert await run(parser().parse_args([str(book), str(out), *args])) == 0
        jobs = (await client.get(f"{gw.url}/v1/audio/batches")).json()["data"]
    assert [j["request_counts"]["total"] for j in jobs] == [2, 12]  # the resume sent only the 2 missing
    assert backend.num_streams_opened == opened + 2
    assert (out / "line-00003.wav").is_file() and (out / "line-00007.wav").is_file()


async def test_without_batch_jobs_it_streams_and_waits_out_rate_limits(tmp_path: Path) -> None:
    backend = fake()
    book, out = tmp_path / "book.jsonl", tmp_path / "out"
    rows = [{"custom_id": f"ch1/{i}", "input": f"Line {i} said once.", "response_format": "pcm"} for i in range(6)]
    book.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"batches": {"enabled": False}, "cache": {"enabled": False}}
    async with running_gateway(config, backend=backend) as gw:
        key = await add_key(gw, Account(name="reader", limits=Limits(rps=4.0, burst=2)))
        started = time.monotonic()
        args = [str(book), str(out), "--url", gw.url, "--key", key, "--quiet", "--concurrency", "6"]
        assert await run(parser().parse_args(args)) == 0
        took = time.monotonic() - started
        limited = gw.services.metrics.api_rate_limited.labels("reader", "requests")._value.get()
    assert limited >= 1  # it met the limit and went on
    assert took >= 0.9  # 6 requests at 4/s with a burst of 2: the retries waited for the bucket
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".pcm") == [f"ch1_{i}.pcm" for i in range(6)]
    assert backend.num_streams_opened >= 6


def test_bad_input_and_a_server_that_is_not_there(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": 3}\n')
    assert main([str(bad), str(tmp_path / "o"), "--quiet"]) == 2
    book = tmp_path / "book.txt"
    texts(book, 2)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "gateway.batch", str(book), str(tmp_path / "o"), "--url",
                           "http://127.0.0.1:9", "--retries", "2", "--quiet"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "error" in done.stderr
