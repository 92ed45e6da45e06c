"""The batch client: ``python -m gateway.batch INPUT OUTDIR --url URL --key KEY`` speaks a whole file.

INPUT is ``.txt`` (one item per non-empty line; ``custom_id`` ``line-00001`` ...) or ``.jsonl`` (the
lines ``POST /v1/audio/batches`` takes: ``custom_id``, ``input``, ``voice``, ``response_format``,
``speed``, ...). OUTDIR gets one audio file per item, named after its custom_id, and ``manifest.jsonl``
(custom_id, file, duration_s, status, error).

- ``--mode batch`` (the default, ``auto``, when the server has batch jobs): the missing items go up as
  one batch job; the client shows its progress, then downloads the results zip and unpacks it. The job's
  id is kept in ``OUTDIR/.batch-job.json`` while it runs: a client stopped meanwhile (Ctrl-C, a lost
  connection) finds the same job again when run again, instead of sending a second one.
- ``--mode stream`` (``auto`` against a server without batch jobs): each item through
  ``/v1/audio/speech``, ``--concurrency`` at a time over one connection pool.

Every call is retried with exponential back-off and jitter on 429, 502, 503, 504 and lost connections,
honouring ``Retry-After`` (tenacity), up to ``--retries`` tries; a 429 ``insufficient_quota`` (or any
answer with ``x-should-retry: false``) is not retried. **Resume**: an item counts as done when its file
is in OUTDIR (files are written whole: a temporary file, then a rename), so running the same command again
requests only the missing and failed items. A progress bar (tqdm) shows items done.
Exit codes: 0 every item has its file, 1 some failed (listed in the manifest), 2 bad input or arguments.

The client polls the job's status (``--poll-s``): the batch API is plain HTTP with no push.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)
from tqdm import tqdm

from gateway.service.batches.archive import archive_name
from gateway.service.batches.jsonl import BatchInputError, BatchLine, parse_jsonl
from gateway.voices.files import atomic_write

__all__ = ["Item", "main", "read_items", "run"]

T = TypeVar("T")
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER_S = 300.0  # a longer Retry-After is waited this long at most per try
STATE = ".batch-job.json"
MANIFEST = "manifest.jsonl"
MAX_INPUT_ITEMS = 1_000_000


@dataclass(frozen=True)
class Item:
    line: BatchLine
    file: str  # its name in OUTDIR

    @property
    def custom_id(self) -> str:
        return self.line.custom_id

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"input": self.line.input, "response_format": self.line.response_format,
                                "speed": self.line.speed}  # fmt: skip
        for name, value in (("voice", self.line.voice), ("instructions", self.line.instructions),
                            ("sample_rate", self.line.sample_rate)):  # fmt: skip
            if value is not None:
                body[name] = value
        return body


class Retryable(Exception):
    """An answer worth another try (429/5xx, a lost connection); ``retry_after_s`` from the server."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Refused(Exception):
    """An answer no retry will change (4xx, ``x-should-retry: false``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def read_items(path: Path, *, voice: str | None, fmt: str, speed: float) -> list[Item]:
    """The items of a .txt or .jsonl file, with their file names in OUTDIR (unique, from custom_id)."""
    data = path.read_bytes()
    if path.suffix.lower() == ".jsonl":
        lines = parse_jsonl(data, max_items=MAX_INPUT_ITEMS)
        lines = [BatchLine(line.line, line.custom_id, line.input, line.voice or voice, line.response_format,
                           line.speed, line.instructions, line.sample_rate) for line in lines]  # fmt: skip
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BatchInputError([f"the file is not UTF-8 (byte {exc.start})"]) from None
        lines = [BatchLine(n, f"line-{n:05d}", raw.strip(), voice, fmt, speed, None, None)
                 for n, raw in enumerate(text.splitlines(), start=1) if raw.strip()]  # fmt: skip
        if not lines:
            raise BatchInputError(["no text in the file"])
    taken: set[str] = set()
    return [Item(line, archive_name(line.custom_id, idx, line.response_format, taken)) for idx, line in enumerate(lines)]


def _message(reply: httpx.Response) -> str:
    try:
        return str(reply.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return reply.text[:300]


def check(reply: httpx.Response) -> httpx.Response:
    """``reply`` when it is a success; ``Retryable`` or ``Refused`` otherwise."""
    if reply.status_code < 400:
        return reply
    if reply.status_code in RETRY_STATUSES and reply.headers.get("x-should-retry") != "false":
        after: float | None = None
        try:
            if "retry-after-ms" in reply.headers:
                after = float(reply.headers["retry-after-ms"]) / 1000
            elif "retry-after" in reply.headers:
                after = float(reply.headers["retry-after"])
        except ValueError:
            after = None
        raise Retryable(f"{reply.status_code}: {_message(reply)}", after)
    raise Refused(reply.status_code, _message(reply))


def _wait(retry: RetryCallState, backoff: wait_random_exponential) -> float:
    """The server's Retry-After (plus a little jitter, so clients do not come back in step), else
    exponential back-off with full jitter."""
    exc = retry.outcome.exception() if retry.outcome is not None else None
    if isinstance(exc, Retryable) and exc.retry_after_s is not None:
        return min(exc.retry_after_s, MAX_RETRY_AFTER_S) + random.uniform(0, 0.1)
    return backoff(retry)


async def with_retries(call: Callable[[], Awaitable[T]], retries: int, max_wait_s: float = 30.0) -> T:
    """``call()`` until it succeeds, up to ``retries`` tries (module docstring)."""
    backoff = wait_random_exponential(multiplier=0.5, max=max_wait_s)
    retrying = AsyncRetrying(
        stop=stop_after_attempt(retries),
        wait=lambda state: _wait(state, backoff),
        retry=retry_if_exception(lambda exc: isinstance(exc, Retryable | httpx.TransportError)),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await call()
    raise AssertionError("unreachable")  # reraise=True: the last error was raised


class Client:
    def __init__(self, args: argparse.Namespace, items: list[Item]) -> None:
        self.args = args
        self.items = items
        self.out = Path(args.outdir)
        self.manifest: dict[str, dict[str, Any]] = {}
        headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
        self.http = httpx.AsyncClient(base_url=args.url.rstrip("/"), headers=headers, timeout=args.timeout_s,
                                      limits=httpx.Limits(max_connections=max(2, args.concurrency)))  # fmt: skip

    def missing(self) -> list[Item]:
        return [item for item in self.items if not (self.out / item.file).is_file()]

    def load_manifest(self) -> None:
        path = self.out / MANIFEST
        if path.is_file():
            for raw in path.read_text("utf-8").splitlines():
                try:
                    row = json.loads(raw)
                    self.manifest[row["custom_id"]] = row
                except (ValueError, KeyError, TypeError):
                    continue

    def save_manifest(self) -> None:
        rows = []
        for item in self.items:
            row = self.manifest.get(item.custom_id) or {"custom_id": item.custom_id, "file": None,
                                                          "duration_s": None, "status": "missing", "error": None}  # fmt: skip
            if (self.out / item.file).is_file():
                row = {**row, "file": item.file, "status": "done", "error": None}
            rows.append(json.dumps(row, ensure_ascii=False))
        atomic_write(self.out / MANIFEST, ("\n".join(rows) + "\n").encode())

    async def call(self, method: str, url: str, **kw: Any) -> httpx.Response:
        async def once() -> httpx.Response:
            return check(await self.http.request(method, url, **kw))

        return await with_retries(once, self.args.retries)

    # ---- batch mode ----------------------------------------------------------------------

    async def run_batch(self, todo: list[Item]) -> bool | None:
        """The items as a batch job; None when the server has no batch jobs."""
        state_path = self.out / STATE
        job_id = self._resumable_job(state_path, todo)
        if job_id is None:
            body = "".join(json.dumps({"custom_id": i.custom_id, **i.body()}, ensure_ascii=False) + "\n" for i in todo)
            try:
                reply = await self.call("POST", "/v1/audio/batches", content=body.encode(),
                                        headers={"Content-Type": "application/jsonl"})  # fmt: skip
            except Refused as exc:
                if exc.status in (404, 405):
                    return None
                raise
            job_id = reply.json()["id"]
            atomic_write(state_path, json.dumps({"job": job_id, "url": self.args.url,
                                                "ids": [i.custom_id for i in todo]}).encode())  # fmt: skip
        job = await self._follow(job_id, len(todo))
        await self._download(job_id)
        state_path.unlink(missing_ok=True)
        return job["request_counts"]["completed"] == job["request_counts"]["total"]

    def _resumable_job(self, state_path: Path, todo: list[Item]) -> str | None:
        try:
            state = json.loads(state_path.read_text())
        except (OSError, ValueError):
            return None
        ids = {i.custom_id for i in todo}
        if state.get("url") != self.args.url or not ids <= set(state.get("ids", [])):
            return None
        return str(state["job"])

    async def _follow(self, job_id: str, total: int) -> dict[str, Any]:
        with tqdm(total=total, unit="item", desc=f"batch {job_id[-8:]}", disable=self.args.quiet) as bar:
            while True:
                job = (await self.call("GET", f"/v1/audio/batches/{job_id}")).json()
                counts = job["request_counts"]
                finished = counts["completed"] + counts["failed"] + counts["cancelled"]
                bar.total = counts["total"]
                bar.update(finished - bar.n)
                bar.set_postfix(failed=counts["failed"])
                if job["status"] in ("completed", "cancelled"):
                    return job
                await asyncio.sleep(self.args.poll_s)

    async def _download(self, job_id: str) -> None:
        with tempfile.TemporaryFile() as spool:
            async def fetch() -> None:
                spool.seek(0)
                spool.truncate()
                async with self.http.stream("GET", f"/v1/audio/batches/{job_id}/results?format=zip") as reply:
                    if reply.status_code >= 400:
                        await reply.aread()
                        check(reply)
                    async for piece in reply.aiter_bytes():
                        spool.write(piece)

            await with_retries(fetch, self.args.retries)
            spool.seek(0)
            with zipfile.ZipFile(spool) as archive:
                rows = [json.loads(line) for line in archive.read(MANIFEST).decode().splitlines() if line.strip()]
                by_id = {item.custom_id: item for item in self.items}
                for row in rows:
                    item = by_id.get(row["custom_id"])
                    if item is None:
                        continue
                    if row.get("file"):
                        atomic_write(self.out / item.file, archive.read(row["file"]))
                    self.manifest[item.custom_id] = {**row, "file": item.file if row.get("file") else None}

    # ---- stream mode ---------------------------------------------------------------------

    async def run_stream(self, todo: list[Item]) -> bool:
        gate = asyncio.Semaphore(self.args.concurrency)
        failed = 0
        with tqdm(total=len(todo), unit="item", desc="speech", disable=self.args.quiet) as bar:

            async def one(item: Item) -> None:
                nonlocal failed
                async with gate:
                    try:
                        reply = await self.call("POST", "/v1/audio/speech", json=item.body())
                    except (Retryable, Refused, httpx.TransportError) as exc:
                        failed += 1
                        self.manifest[item.custom_id] = {"custom_id": item.custom_id, "file": None,
                                                         "duration_s": None, "status": "failed", "error": str(exc)}  # fmt: skip
                    else:
                        atomic_write(self.out / item.file, reply.content)
                        self.manifest[item.custom_id] = {"custom_id": item.custom_id, "file": item.file,
                                                         "duration_s": None, "status": "done", "error": None}  # fmt: skip
                    bar.update(1)
                    bar.set_postfix(failed=failed)

            async with asyncio.TaskGroup() as group:
                for item in todo:
                    group.create_task(one(item))
        return failed == 0


async def run(args: argparse.Namespace) -> int:
    try:
        items = read_items(Path(args.input), voice=args.voice, fmt=args.format, speed=args.speed)
    except (OSError, BatchInputError) as exc:
        print(f"error: {args.input}: {exc}", file=sys.stderr)
        return 2
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    client = Client(args, items)
    client.load_manifest()
    todo = client.missing()
    try:
        if not todo:
            print(f"all {len(items)} items are in {out} already", file=sys.stderr)
        else:
            print(f"{len(todo)} of {len(items)} items to make", file=sys.stderr)
            ran: bool | None = None
            if args.mode in ("auto", "batch"):
                ran = await client.run_batch(todo)
                if ran is None and args.mode == "batch":
                    print("error: the server has no batch jobs (try --mode stream)", file=sys.stderr)
                    return 2
            if ran is None:
                await client.run_stream(todo)
    except (Retryable, Refused, httpx.TransportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.save_manifest()
        await client.http.aclose()
    left = client.missing()
    if left:
        print(f"{len(left)} item(s) failed (see {out / MANIFEST}); run again to retry them", file=sys.stderr)
        return 1
    print(f"done: {len(items)} items in {out}", file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gateway.batch", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("input", help="a .txt file (one item per line) or a .jsonl file of speech requests")
    p.add_argument("outdir", help="where the audio files and manifest.jsonl go")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway (default %(default)s)")
    p.add_argument("--key", default=os.environ.get("XZ_API_KEY"), help="API key (default: env XZ_API_KEY)")
    p.add_argument("--mode", choices=["auto", "batch", "stream"], default="auto")
    p.add_argument("--voice", help="voice of items that name none")
    p.add_argument("--format", default="wav", help="response_format of .txt items (default %(default)s)")
    p.add_argument("--speed", type=float, default=1.0, help="speed of .txt items")
    p.add_argument("--concurrency", type=int, default=4, help="requests at once in stream mode")
    p.add_argument("--retries", type=int, default=8, help="tries per call (default %(default)s)")
    p.add_argument("--poll-s", type=float, default=2.0, help="seconds between status reads of a job")
    p.add_argument("--timeout-s", type=float, default=300.0, help="one HTTP call's time limit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.concurrency < 1 or args.retries < 1 or args.poll_s <= 0:
        print("error: --concurrency and --retries must be at least 1, --poll-s above 0", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        print("stopped; run the same command again to go on", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
