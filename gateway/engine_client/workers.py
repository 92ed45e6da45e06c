"""Keeping one engine worker connected: start its process (or reach a remote one), restart on loss.

A ``WorkerSlot`` is one worker address. For a worker this gateway starts, the slot runs
``python -m tts_engine serve`` on a unix socket in a private run folder, hands it its settings on stdin
(one line of JSON; the pipe stays open, and its end stops the worker), waits for its ``READY`` line
(timeout), connects, and when the link is lost or the process exits it kills what is left and starts it
again after a backoff (1 s doubling to 30 s; the count resets once a worker stayed up a minute). It
never gives up: after ``max_restarts`` failures in a row the slot shows as ``failed`` and goes on
trying every 30 s. A remote slot (``engine.remote``) reconnects the same way. Each new link gets the
gateway's run-time voices replayed (``on_ready``) before it takes requests.

A link that stalls (no answer to a ping, or an engine step that never ends; ``WorkerLink``) is not
ready while it stalls; when it ends for that reason, its process is killed at once (a stopped process
would not act on SIGTERM) and started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.engine_client.link import WorkerLink
from tts_engine.errors import WorkerLost

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0  # a worker up this long resets the restart count


@dataclass
class WorkerCommand:
    """How to start a local worker process: its backend, device, settings (the config sections it
    reads, sent on its stdin) and the folder its scratch files go to."""

    backend: str
    device: str
    config: dict[str, Any]
    scratch_dir: str | None = None
    backend_options: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, listen: str) -> list[str]:
        argv = [sys.executable, "-m", "tts_engine", "serve", "--backend", self.backend, "--device", self.device,
                "--listen", listen, "--config-stdin"]  # fmt: skip
        if self.scratch_dir:
            argv += ["--scratch-dir", self.scratch_dir]
        if self.backend_options:
            argv += ["--backend-options", json.dumps(self.backend_options)]
        return argv

    def stdin_line(self) -> bytes:
        return json.dumps(self.config, separators=(",", ":")).encode("utf-8") + b"\n"


class WorkerSlot:
    def __init__(
        self,
        address: str,
        *,
        command: WorkerCommand | None = None,
        connect_timeout_s: float = 10.0,
        start_timeout_s: float = 300.0,
        max_restarts: int = 10,
        on_ready: Callable[[WorkerLink], Awaitable[None]] | None = None,
        token: str = "",
        stall_timeout_s: float = 5.0,
    ) -> None:
        self.address = address
        self.token = token  # sent first to a worker that checks one (engine.remote_token)
        self.command = command
        self.connect_timeout_s = connect_timeout_s
        self.start_timeout_s = start_timeout_s
        self.max_restarts = max_restarts  # failures in a row before the slot shows as failed
        self.stall_timeout_s = stall_timeout_s
        self.backoff_start_s = BACKOFF_START_S
        self._on_ready = on_ready
        self.link: WorkerLink | None = None  # set while connected and ready for requests
        self.state = "starting"
        self.restarts = 0
        self.stalls = 0  # of links already dropped (the live link counts its own)
        self.last_error: str | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.first_ready: asyncio.Future[None] | None = None  # made in start(), on the serving loop
        self._task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None

    @property
    def device(self) -> str:
        if self.link is not None and self.link.report.device:
            return self.link.report.device
        return self.command.device if self.command else "remote"

    def start(self) -> None:
        self.first_ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name=f"engine-worker {self.address}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._drop()
        self.state = "closed"

    @property
    def is_ready(self) -> bool:
        """Connected, not stalled: routing may send it requests."""
        return self.link is not None and self.link.is_ready

    def health(self) -> dict[str, Any]:
        link = self.link
        report = link.report if link is not None else None
        stalled = link.stalled if link is not None else None
        return {
            "address": self.address,
            "device": self.device,
            # "lost": the link is gone and the supervisor has not yet moved on (restarting, failed)
            "state": "stalled" if stalled else "lost" if self.state == "ready" and not self.is_ready else self.state,
            "stalled": stalled,
            "capacity": link.capacity if link is not None else None,
            "in_flight": len(link.streams) if link is not None else 0,
            "worker_in_flight": report.in_flight if report is not None else None,
            "pid": self.process.pid if self.process is not None else report.pid if report is not None else None,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "memory": report.memory if report is not None else None,
        }

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                link = await self._bring_up()
                self.state, self.link = "ready", link
                if self.first_ready is not None and not self.first_ready.done():
                    self.first_ready.set_result(None)
                reason = await self._wait_lost(link)
                self.last_error = reason
            except WorkerLost as exc:
                self.last_error = str(exc)
                log.warning("engine worker %s: %s", self.address, exc)
            except Exception as exc:  # noqa: BLE001 - a replay or start failure is one more failure
                self.last_error = repr(exc)
                log.exception("engine worker %s failed to start", self.address)
            if self.first_ready is not None and not self.first_ready.done():  # start-up goes on without it
                self.first_ready.set_exception(WorkerLost(f"engine worker {self.address}: {self.last_error}"))
            await self._drop()
            if time.monotonic() - started >= HEALTHY_AFTER_S:
                failures = 0
            failures += 1
            delay = min(BACKOFF_MAX_S, self.backoff_start_s * 2 ** min(failures - 1, 16))
            self.restarts += 1
            if failures > self.max_restarts:  # never given up: shown as failed, tried again at the cap
                self.state = "failed"
                log.error(
                    "engine worker %s: %d failed restarts in a row; trying again in %.0f s",
                    self.address, failures - 1, delay,
                )  # fmt: skip
            else:
                self.state = "restarting"
                log.warning("engine worker %s: restart %d in %.0f s", self.address, failures, delay)
            await asyncio.sleep(delay)  # the backoff itself, not a poll

    async def _bring_up(self) -> WorkerLink:
        self.state = "starting"
        if self.command is not None:
            await self._spawn()
        link = WorkerLink(self.address, token=self.token, stall_timeout_s=self.stall_timeout_s)
        await link.connect(self.connect_timeout_s)
        try:
            if self._on_ready is not None:
                await self._on_ready(link)
        except BaseException:
            await link.close()
            raise
        return link

    async def _spawn(self) -> None:
        assert self.command is not None
        path = self.address.removeprefix("unix:")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.process = await asyncio.create_subprocess_exec(
            *self.command.argv(self.address),
            stdin=asyncio.subprocess.PIPE,  # its settings, then its EOF (this process gone) stops the worker
            stdout=asyncio.subprocess.PIPE,
            env=worker_environment(self.command.env),
            # its own process group: a terminal's Ctrl-C reaches the gateway only, which then closes
            # its workers in order (in-flight requests end, no "worker lost" at every shutdown)
            start_new_session=True,
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        try:
            async with asyncio.timeout(self.start_timeout_s):
                # its settings: one line of JSON on the pipe, never in a file (the pipe stays open)
                self.process.stdin.write(self.command.stdin_line())
                await self.process.stdin.drain()
                while line := await self.process.stdout.readline():
                    if line.startswith(b"READY"):
                        break
                else:
                    raise WorkerLost(f"worker exited with {await self.process.wait()} before it was ready")
        except TimeoutError as exc:
            raise WorkerLost(f"worker not ready within {self.start_timeout_s:.0f} s") from exc
        except (ConnectionError, OSError) as exc:  # it exited before it read its settings
            raise WorkerLost(f"worker exited with {await self.process.wait()} before it was ready") from exc
        self._drain_task = asyncio.create_task(_drain(self.process.stdout))

    async def _wait_lost(self, link: WorkerLink) -> str:
        assert link.lost is not None
        waits: list[asyncio.Future[Any]] = [link.lost]
        if self.process is not None:
            waits.append(asyncio.ensure_future(self.process.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits[1:]:
                wait.cancel()
        if link.lost.done():
            return link.lost.result()
        return f"worker process exited with {self.process.returncode if self.process else '?'}"

    async def _drop(self) -> None:
        link, self.link = self.link, None
        stalled = link is not None and link.stalled is not None
        if link is not None:
            self.stalls += link.counts["stalls"]
            await link.close()
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # a stalled (maybe stopped) worker: at once
                process.send_signal(signal.SIGKILL if stalled else signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()


def worker_environment(extra: dict[str, str]) -> dict[str, str]:
    """The gateway's environment without its config overrides (``XZ_*``: they may hold secrets, and the
    worker's settings come on its stdin), plus ``extra``."""
    return {key: value for key, value in os.environ.items() if not key.startswith("XZ_")} | extra


async def _drain(stream: asyncio.StreamReader) -> None:
    """Read a worker's stdout to its end so the pipe never fills (it logs to stderr)."""
    with contextlib.suppress(Exception):
        while await stream.read(4096):
            pass
