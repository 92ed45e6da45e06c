"""``BatchRunner``: works through the store's batch items in the background of a gateway.

Up to ``batches.concurrency`` items at once, each asking the engine in the ``batch`` priority class (it
only fills capacity that device turns and API streams leave free; gateway/service/engine_requests.py)
through the audio cache (a repeated sentence is synthesised once). An item's audio is encoded, written to
its job's folder (a temporary file, fsync, rename: a file under its final name is always whole) and then
recorded ``done`` in the store.

No item is lost and none done twice:

- Items are claimed with a lease in one transaction (gateway/service/batches/store.py); a gateway killed
  mid-way leaves leases that run out, and its items are taken again, by another gateway or by itself
  after a restart. A clean shutdown gives its items back at once.
- The result file's name carries the item's index and its length (``000017-57600-24000.wav``). A runner
  that takes an item whose file is already there (the gateway died after the rename, before the store
  heard of it) records that file instead of synthesising the item again.
- Recording an outcome needs the item's lease: a runner whose lease ran out writes nothing.

A failed item is tried again after ``retry_s`` x 2^(tries-1) (engine busy or restarting, a timeout), up to
``batches.max_attempts`` tries, then recorded as failed; input the engine refuses fails at once. Cancelling
a job (``stop_job``) cancels its items' tasks, which aborts their engine streams at once (the engine drops
them at its next step). Waits are events and deadlines: the runner wakes when a job is submitted here, an
item ends or a retry is due, and every ``batches.scan_s`` to look for work sent to other gateways.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from audio_codecs.formats import encode_audio
from gateway.config import BatchesConfig
from gateway.service.accounts import Account
from gateway.service.batches.store import BatchStore, ItemRow
from gateway.service.cache import AudioCache
from gateway.service.speech import open_speech
from gateway.service.usage import UsageMeter, key_subject
from gateway.store import StoreError
from gateway.voices.files import atomic_write
from tts_engine.errors import EngineError, EngineOverloaded, EngineUnavailable, SynthesisFailed, UnknownVoice
from tts_engine.interface import SpeechEngine

if TYPE_CHECKING:
    from gateway.voices.store import VoiceStore

__all__ = ["BatchRunner", "result_name"]

log = logging.getLogger(__name__)

_RESULT = re.compile(r"(\d{6,})-(\d+)-(\d+)\.(\w+)")
STOP_WAIT_S = 10.0  # the longest a cancel or shutdown waits for its items' tasks (a cancel: and their records)


def result_name(idx: int, samples: int, rate: int, fmt: str) -> str:
    return f"{idx:06d}-{samples}-{rate}.{fmt}"


def find_result(folder: Path, idx: int, fmt: str) -> tuple[str, float] | None:
    """An item's finished file in ``folder`` (written whole: see the module docstring), with its length."""
    for path in folder.glob(f"{idx:06d}-*.{fmt}"):
        match = _RESULT.fullmatch(path.name)
        if match and int(match.group(1)) == idx:
            return path.name, int(match.group(2)) / int(match.group(3))
    return None


class _Permanent(Exception):
    """An item that will fail however often it is tried."""


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        engine: SpeechEngine,
        cfg: BatchesConfig,
        folder: Path,
        *,
        cache: AudioCache | None = None,
        voices_of: Callable[[], VoiceStore | None] | None = None,
        meter: UsageMeter | None = None,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.cfg = cfg
        self.folder = folder
        self.cache = cache
        self._voices_of = voices_of or (lambda: None)
        self.meter = meter
        self._on_outcome = on_outcome or (lambda outcome: None)
        self.id = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._items: dict[tuple[str, int], ItemRow] = {}  # the item of each task in _tasks
        self._stopping: set[str] = set()  # jobs whose items are being cancelled
        # jobs cancelled while this runner runs: an item claimed just before the cancel committed, whose
        # task starts after stop_job() looked, is recorded cancelled instead of being synthesised
        self._cancelled: set[str] = set()
        self._wake = asyncio.Event()
        self._main: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._closing = False
        self._store_down = False
        self.items_done = 0  # by this runner (tests, status)

    # ---- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        if self._main is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self._main = asyncio.create_task(self._run(), name="batch runner")
        self._heartbeat = asyncio.create_task(self._renew_leases(), name="batch leases")

    def wake(self) -> None:
        """There may be work (a job was submitted here)."""
        self._wake.set()

    async def aclose(self) -> None:
        """Stops taking items, cancels the running ones and gives them back to the store (bounded)."""
        self._closing = True
        for task in (self._main, self._heartbeat):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._main, self._heartbeat) if t is not None), return_exceptions=True)
        keys = list(self._tasks)
        for task in self._tasks.values():
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=STOP_WAIT_S)
        if keys:
            try:
                await self.store.release(self.id, keys)
            except StoreError as exc:
                log.warning("batch items %d not given back (%s): their leases run out instead", len(keys), exc)

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def stop_job(self, job_id: str) -> None:
        """The job was cancelled: its items' engine streams are aborted now; returns once their tasks ended
        and their outcomes are recorded, or after ``STOP_WAIT_S`` (and at most one store call) in all: a
        cancel's answer stays bounded also while the store is down (the job is already cancelled there)."""
        self._cancelled.add(job_id)
        mine = [(key, task) for key, task in self._tasks.items() if key[0] == job_id]
        if not mine:
            return
        deadline = time.monotonic() + STOP_WAIT_S
        items = [self._items[key] for key, _ in mine if key in self._items]
        self._stopping.add(job_id)
        for _, task in mine:
            task.cancel()
        await asyncio.wait([task for _, task in mine], timeout=STOP_WAIT_S)
        # A task cancelled before it first ran never reached its own handler: its item is still this
        # runner's and running. finish() writes only such items, so the others are left as they ended.
        for done, item in enumerate(items):
            if time.monotonic() >= deadline:
                log.warning("batch %s: %d cancelled items not recorded within %g s; they stay unfinished in a "
                            "cancelled job", job_id, len(items) - done, STOP_WAIT_S)  # fmt: skip
                return
            await self._finish(item, "cancelled", deadline=deadline, error="the job was cancelled")

    # ---- the loops -------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._closing:
            self._wake.clear()
            free = self.cfg.concurrency - len(self._tasks)
            if free > 0:
                try:
                    items = await self.store.claim(self.id, free, self.cfg.lease_s)
                except StoreError as exc:
                    items = []
                    if not self._store_down:
                        log.warning("batch runner: the store is unavailable (%s); trying again", exc)
                    self._store_down = True
                else:
                    if self._store_down:
                        log.info("batch runner: the store is back")
                    self._store_down = False
                for item in items:
                    key = (item.job_id, item.idx)
                    task = asyncio.create_task(self._item(item), name=f"batch item {item.job_id}/{item.idx}")
                    self._tasks[key] = task
                    self._items[key] = item
                    task.add_done_callback(self._on_end(key))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.scan_s):
                    await self._wake.wait()

    def _on_end(self, key: tuple[str, int]) -> Callable[[asyncio.Task[None]], None]:
        return lambda _task: self._ended(key)

    def _ended(self, key: tuple[str, int]) -> None:
        self._tasks.pop(key, None)
        self._items.pop(key, None)
        if not any(job == key[0] for job, _ in self._tasks):
            self._stopping.discard(key[0])
        self._wake.set()

    async def _renew_leases(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.lease_s / 3)  # a deadline to keep, not a poll for work
            keys = list(self._tasks)
            try:
                stopped = await self.store.renew(self.id, keys, self.cfg.lease_s)
            except StoreError as exc:
                log.warning("batch runner: leases not renewed (%s)", exc)
                continue
            for job_id in stopped:  # cancelled through another gateway
                asyncio.create_task(self.stop_job(job_id), name=f"stop batch {job_id}")

    # ---- one item --------------------------------------------------------------------

    async def _item(self, item: ItemRow) -> None:
        if item.job_id in self._cancelled:  # claimed in the same moment as the cancel
            await self._finish(item, "cancelled", error="the job was cancelled")
            return
        request = item.request
        fmt = request["response_format"]
        job_folder = self.folder / item.job_id
        try:
            found = await asyncio.to_thread(find_result, job_folder, item.idx, fmt)
            if found is None:
                name, seconds = await self._synthesise(item, job_folder)
            else:  # written before a crash, never recorded: take it as it is
                name, seconds = found
                log.info("batch %s item %d: result file found (%s), recorded without synthesis",
                         item.job_id, item.idx, name)  # fmt: skip
        except asyncio.CancelledError:
            if item.job_id in self._stopping and not self._closing:
                await asyncio.shield(self._finish(item, "cancelled", error="the job was cancelled"))
            raise
        except _Permanent as exc:
            await self._finish(item, "failed", error=str(exc))
            self._meter(item, 0.0, failed=True)
            return
        except (EngineError, TimeoutError, OSError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if item.attempts >= self.cfg.max_attempts:
                await self._finish(item, "failed", error=f"failed {item.attempts} times; last: {why}")
                self._meter(item, 0.0, failed=True)
            else:
                delay = self.cfg.retry_s * 2 ** (item.attempts - 1)
                await self._finish(item, "pending", error=why, retry_at=time.time() + delay)
                asyncio.get_running_loop().call_later(delay, self._wake.set)
            return
        if await self._finish(item, "done", file=name, duration_s=seconds):
            self.items_done += 1
            self._meter(item, seconds, failed=False)

    async def _synthesise(self, item: ItemRow, job_folder: Path) -> tuple[str, float]:
        request = item.request
        fmt, rate = request["response_format"], request["sample_rate"]
        owner = Account(name=item.request.get("owner", ""), cache=bool(request.get("cache", True)))
        voices = self._voices_of()
        async with asyncio.timeout(self.cfg.item_timeout_s):
            try:
                stream, _ = await open_speech(
                    self.engine, self.cache, voices, owner, request["input"], voice=request["voice"],
                    output_rate=rate, speed=request["speed"], instruct=request.get("instructions"),
                    paced=False, priority="batch",
                )  # fmt: skip
            except UnknownVoice as exc:
                raise _Permanent(str(exc)) from exc
            except EngineOverloaded:
                raise
            except (EngineError, ValueError) as exc:
                if isinstance(exc, EngineUnavailable):
                    raise
                raise _Permanent(f"the engine refused it: {exc}") from exc
            async with stream:
                try:
                    chunks = [chunk async for chunk in stream]
                except SynthesisFailed as exc:
                    if isinstance(exc.cause, ValueError):
                        raise _Permanent(f"the engine refused it: {exc.cause}") from exc
                    raise
        pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
        data = await asyncio.to_thread(encode_audio, pcm, rate, fmt)
        name = result_name(item.idx, int(pcm.size), rate, fmt)
        job_folder.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(atomic_write, job_folder / name, data)
        return name, pcm.size / rate

    async def _finish(self, item: ItemRow, status: str, *, deadline: float | None = None, **kw: object) -> bool:
        """Records the outcome, trying again while the store is down until ``deadline`` (monotonic; by
        default the item's lease: after it, another runner owns the item and nothing is written)."""
        deadline = time.monotonic() + self.cfg.lease_s if deadline is None else deadline
        delay = 0.2
        while True:
            try:
                return await self.store.finish(item, self.id, status=status, **kw)  # type: ignore[arg-type]
            except StoreError as exc:
                if time.monotonic() + delay > deadline:
                    log.warning("batch %s item %d: outcome %s not recorded (%s); it will be taken again",
                                item.job_id, item.idx, status, exc)  # fmt: skip
                    return False
                await asyncio.sleep(delay)  # a bounded retry of one write, not a poll
                delay = min(delay * 2, 2.0)

    def _meter(self, item: ItemRow, seconds: float, *, failed: bool) -> None:
        self._on_outcome("failed" if failed else "done")
        owner = item.request.get("owner")
        if self.meter is not None and owner:
            self.meter.record(key_subject(owner), characters=0 if failed else item.chars, audio_s=seconds,
                              errors=int(failed))  # fmt: skip
