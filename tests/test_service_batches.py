"""Batch jobs (gateway/service/batches, /v1/audio/batches): a 200-item job whose gateway (a subprocess) is
killed with SIGKILL half way, then restarted, completes with 200 distinct results and no finished item done
twice; cancel stops the work within a step, and answers within its bound while the store is down; bad input
is a 400 listing its lines; jobs are per key."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from audio_codecs.wav import read_wav
from gateway.config import BatchesConfig
from gateway.service.accounts import Account, Limits
from gateway.service.batches import runner as batch_runner
from gateway.service.batches.runner import BatchRunner
from gateway.service.batches.store import ItemRow
from gateway.store import StoreUnavailable
from tests.api_helpers import slow
from tests.gateway_server import running_gateway
from tests.test_service_limits import add_key
from tts_engine.backends.fake import FakeBackend

ROOT = Path(__file__).resolve().parent.parent
ITEMS = 200


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gateway(config: Path, port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port), "--host", "127.0.0.1"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip


async def wait_for(client: httpx.AsyncClient, url: str, predicate, timeout_s: float, proc=None) -> dict:
    """Polls ``url`` (a test waiting on a server it watches from outside) until ``predicate(json)``."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc is None or proc.poll() is None, "the gateway died"
        try:
            reply = await client.get(url)
            if reply.status_code == 200 and predicate(reply.json()):
                return reply.json()
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"not reached within {timeout_s} s"
        await asyncio.sleep(0.1)


def done_items(db: Path, job: str) -> dict[int, tuple[int, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT idx, attempts, file FROM batches_items WHERE job_id=? AND status='done'", (job,))
        return {idx: (attempts, file) for idx, attempts, file in rows}


async def test_a_job_killed_half_way_completes_after_a_restart_with_nothing_lost_or_done_twice(tmp_path: Path) -> None:
    db, results = tmp_path / "store.db", tmp_path / "batches"
    config = tmp_path / "gateway.yaml"
    config.write_text(json.dumps({
        "tts": {"backend": "gpu-sim", "text_normalization": "off"}, "asr": {"backend": "none"},
        "engine": {"workers": 0}, "store": {"url": f"sqlite:///{db}"}, "cache": {"enabled": False},
        "batches": {"dir": str(results), "concurrency": 8, "lease_s": 2, "scan_s": 0.5},
        "session": {"memory": "none"},
    }))  # fmt: skip
    log = tmp_path / "gateway.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    lines = [{"custom_id": f"item-{i:03d}", "input": f"item {i}", "response_format": "wav"} for i in range(ITEMS)]
    proc = start_gateway(config, port, log)
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            await wait_for(client, f"{url}/v1/health", lambda _: True, 120, proc)
            created = await client.post(f"{url}/v1/audio/batches", content=jsonl(lines),
                                        headers={"Content-Type": "application/jsonl"})  # fmt: skip
            assert created.status_code == 200, created.text
            job = created.json()["id"]
            await wait_for(client, f"{url}/v1/audio/batches/{job}",
                           lambda j: j["request_counts"]["completed"] >= ITEMS // 3, 120, proc)  # fmt: skip
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            before = done_items(db, job)
            assert ITEMS // 3 <= len(before) < ITEMS, len(before)
            stamps = {idx: (results / job / file).stat().st_mtime_ns for idx, (_, file) in before.items()}

            proc = start_gateway(config, port, log)
            final = await wait_for(client, f"{url}/v1/audio/batches/{job}", lambda j: j["status"] == "completed",
                                   180, proc)  # fmt: skip
            archive = await client.get(f"{url}/v1/audio/batches/{job}/results")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    assert final["request_counts"] == {"total": ITEMS, "completed": ITEMS, "failed": 0, "cancelled": 0, "pending": 0}
    after = done_items(db, job)
    assert len(after) == ITEMS
    for idx, (attempts, file) in before.items():  # finished before the kill: never taken again
        assert after[idx] == (attempts, file)
        assert (results / job / file).stat().st_mtime_ns == stamps[idx]
    files = sorted(p.name for p in (results / job).iterdir() if not p.name.startswith("."))
    assert len(files) == ITEMS and len({f.split("-")[0] for f in files}) == ITEMS  # one file per item
    with zipfile.ZipFile(io.BytesIO(archive.content)) as z:
        manifest = [json.loads(line) for line in z.read("manifest.jsonl").decode().splitlines()]
        audio = {name: z.read(name) for name in z.namelist() if name.endswith(".wav")}
    assert sorted(m["custom_id"] for m in manifest) == [line["custom_id"] for line in lines]
    assert all(m["status"] == "done" and m["file"] in audio and m["duration_s"] > 0 for m in manifest)
    assert len(audio) == ITEMS  # 200 distinct results, each the audio of its own line:
    tone = FakeBackend()  # gpu-sim speaks the fake backend's tone, its length set by the text
    by_id = {m["custom_id"]: m["file"] for m in manifest}
    for line in lines:
        pcm, rate = read_wav(audio[by_id[line["custom_id"]]])
        assert rate == 24000 and pcm.size == tone.num_samples_for(line["input"])


async def test_cancel_stops_the_work_within_a_step(store_url: str, tmp_path: Path) -> None:
    backend = slow()  # 100 ms chunks, 100 ms of compute each: a step of 4 streams is 0.4 s
    config = {"store": {"url": store_url}, "batches": {"dir": str(tmp_path / "b"), "concurrency": 4},
              "cache": {"enabled": False}}  # fmt: skip
    async with running_gateway(config, backend=backend) as gw, httpx.AsyncClient(timeout=30) as client:
        lines = [{"custom_id": f"c{i}", "input": f"a sentence that takes a while, number {i}"} for i in range(40)]
        job = (await client.post(f"{gw.url}/v1/audio/batches", content=jsonl(lines))).json()["id"]
        await wait_for(client, f"{gw.url}/v1/audio/batches/{job}", lambda j: j["request_counts"]["completed"] >= 2, 60)
        async with asyncio.timeout(10):  # items are being synthesised (not between two of them)
            while backend.num_streams_opened <= backend.num_streams_closed:
                await asyncio.sleep(0.005)
        cancelled = (await client.post(f"{gw.url}/v1/audio/batches/{job}/cancel")).json()
        steps_at_cancel = gw.services.engine.stats["steps_total"]
        stopped_at = time.monotonic()
        while backend.num_streams_opened > backend.num_streams_closed:
            assert time.monotonic() - stopped_at < 10, "streams still run 10 s after the cancel"
            await asyncio.sleep(0.01)
        # the step under way when the cancel came, and at most the next one (engine steps, not wall time)
        assert gw.services.engine.stats["steps_total"] - steps_at_cancel <= 2
        opened = backend.num_streams_opened
        await asyncio.sleep(0.5)
        final = (await client.get(f"{gw.url}/v1/audio/batches/{job}")).json()
    assert cancelled["status"] == "cancelled"
    assert backend.num_streams_opened == opened  # nothing started after it
    counts = final["request_counts"]
    assert counts["pending"] == 0 and counts["completed"] + counts["cancelled"] == 40 and counts["completed"] < 40
    assert final["request_counts"] == cancelled["request_counts"]


async def test_a_cancel_while_the_store_is_down_ends_within_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CI run saw a cancel get no answer in 30 s while the SQLite store stalled: each running item's
    outcome was retried for a whole lease (30 s), one item after the other. Now the items' tasks and
    their records share one bound (``STOP_WAIT_S``), whatever the store does."""
    finishes: list[int] = []

    class DownStore:
        async def finish(self, item: ItemRow, runner: str, **kw: object) -> bool:
            finishes.append(item.idx)
            raise StoreUnavailable("the store (test) is unavailable: no answer within 5 s")

    monkeypatch.setattr(batch_runner, "STOP_WAIT_S", 0.5)
    runner = BatchRunner(DownStore(), None, BatchesConfig(lease_s=30), tmp_path)  # type: ignore[arg-type]
    for idx in range(4):
        item = ItemRow(job_id="j", idx=idx, custom_id=f"c{idx}", request={}, chars=1, status="running",
                       attempts=1, file=None, duration_s=None, error=None)  # fmt: skip
        runner._tasks[("j", idx)] = asyncio.create_task(asyncio.sleep(3600))  # an item being synthesised
        runner._items[("j", idx)] = item
    started = time.monotonic()
    async with asyncio.timeout(10):  # before: up to 4 x 30 s of retries
        await runner.stop_job("j")
    assert time.monotonic() - started < 0.5 + 1.5  # the bound, one store call's retry delay and slack
    assert finishes and finishes[0] == 0  # it did try to record them
    assert all(task.cancelled() for task in runner._tasks.values())


async def test_bad_input_is_refused_with_its_lines_and_jobs_are_per_key(tmp_path: Path) -> None:
    config = {"batches": {"dir": str(tmp_path / "b"), "max_items": 5, "max_jobs_per_key": 1},
              "api": {"api_keys": ["sk-admin"]}}  # fmt: skip
    async with running_gateway(config, backend=slow()) as gw, httpx.AsyncClient(timeout=30) as client:
        key = await add_key(gw, Account(name="worker", limits=Limits(rps=100)))
        mine, admin = {"Authorization": f"Bearer {key}"}, {"Authorization": "Bearer sk-admin"}
        bad = b'{"custom_id": "a", "input": "fine"}\nnot json\n{"custom_id": "a", "input": "dup"}\n{"input": 5}\n'
        refused = await client.post(f"{gw.url}/v1/audio/batches", content=bad, headers=mine)
        too_many = await client.post(f"{gw.url}/v1/audio/batches", headers=mine,
                                     content=jsonl([{"input": f"x{i}"} for i in range(6)]))  # fmt: skip
        speed = await client.post(f"{gw.url}/v1/audio/batches", headers=mine,
                                  content=jsonl([{"input": "x", "speed": 99}]))  # fmt: skip
        ok = await client.post(f"{gw.url}/v1/audio/batches", headers=mine, content=jsonl([{"input": "long " * 40}]))
        second = await client.post(f"{gw.url}/v1/audio/batches", headers=mine, content=jsonl([{"input": "y"}]))
        job = ok.json()["id"]
        others = await client.get(f"{gw.url}/v1/audio/batches/{job}", headers=admin)
        listed = (await client.get(f"{gw.url}/v1/audio/batches", headers=mine)).json()
        no_such = await client.get(f"{gw.url}/v1/audio/batches/batch_nope", headers=mine)
        await client.post(f"{gw.url}/v1/audio/batches/{job}/cancel", headers=mine)
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert "line 2" in message and "line 3" in message and "line 4" in message and "line 1" not in message
    assert too_many.status_code == 400 and "more than 5" in too_many.json()["error"]["message"]
    assert speed.status_code == 400 and "speed" in speed.json()["error"]["message"]
    assert ok.status_code == 200 and ok.json()["request_counts"]["total"] == 1
    assert second.status_code == 429 and second.json()["error"]["code"] == "too_many_batches"
    assert others.status_code == 200 and others.json()["owner"] == "worker"  # an admin sees every job
    assert [j["id"] for j in listed["data"]] == [job]
    assert no_such.status_code == 404


@pytest.mark.parametrize("fmt", ["tar"])
async def test_results_as_tar_with_failed_items_in_the_manifest(tmp_path: Path, fmt: str) -> None:
    import tarfile

    from tests.api_helpers import fake

    config = {"batches": {"dir": str(tmp_path / "b"), "max_attempts": 2, "retry_s": 0.05}}
    async with running_gateway(config, backend=fake(fail_on="BOOM")) as gw, httpx.AsyncClient(timeout=30) as client:
        lines = [{"custom_id": "ok", "input": "fine words", "response_format": "mp3"},
                 {"custom_id": "bad", "input": "BOOM goes this one"}]  # fmt: skip
        job = (await client.post(f"{gw.url}/v1/audio/batches", content=jsonl(lines))).json()["id"]
        final = await wait_for(client, f"{gw.url}/v1/audio/batches/{job}", lambda j: j["status"] == "completed", 60)
        reply = await client.get(f"{gw.url}/v1/audio/batches/{job}/results?format={fmt}")
    assert final["request_counts"]["completed"] == 1 and final["request_counts"]["failed"] == 1
    with tarfile.open(fileobj=io.BytesIO(reply.content)) as tar:
        names = tar.getnames()
        manifest = {m["custom_id"]: m for m in map(json.loads, tar.extractfile("manifest.jsonl").read().splitlines())}
    assert sorted(names) == ["manifest.jsonl", "ok.mp3"]
    assert manifest["ok"]["file"] == "ok.mp3" and manifest["bad"]["status"] == "failed"
    assert manifest["bad"]["file"] is None and manifest["bad"]["error"]
