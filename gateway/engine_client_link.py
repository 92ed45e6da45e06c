"""One connection to one engine worker, and the streams of the requests it carries.

``WorkerLink`` connects (unix or TCP, with a timeout), waits for the worker's ``hello`` (with a
timeout), then runs a reader task that feeds frames to the streams and call futures, a writer task
that drains a bounded outbound queue into the socket, and a watchdog that pings the worker every
``PING_INTERVAL_S``. When the socket ends (the worker died, EOF, a protocol error) every request still
in flight fails with ``WorkerLost`` and ``lost`` resolves: the owner restarts or reconnects.

Stalls (a worker alive but making no progress): a ping unanswered for ``stall_timeout_s`` (a frozen
process), or an answer saying the engine's current step has run that long (a stuck engine), makes the
link ``stalled``: not ready for routing, its requests fail at once with ``WorkerLost`` (the device
speaks its apology, the API answers 503) and are aborted on the worker. Pings go on: a worker that
answers again with no long step is ready again; one still stalled after ``STALL_RESTART_FACTOR`` times
the timeout ends the link, and the owner kills and restarts it. Each ping's answer also carries the
worker's load, so the in-flight count routing reads is never more than a ping interval old (besides
the ``end``, ``result`` and ``report`` frames that carry it sooner). ``RemoteStream`` is a ``SynthesisStream`` fed by the link: each chunk
read is reported back (``credit``) so the worker's engine keeps its ``max_buffered_chunks`` bound and
slack ranking end to end; ``set_playback_ahead`` sends the listener's playback credit as a value.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from tts_engine.errors import EngineError, WorkerLost
from tts_engine.request import ChunkCredit, SynthesisStream
from tts_engine.worker import protocol as p
from tts_engine.worker.server import parse_address

log = logging.getLogger(__name__)

OUTBOX_FRAMES = 4096  # frames waiting for the socket; more means the worker stopped reading: link lost
PING_INTERVAL_S = 1.0  # a ping (``health`` call) to each worker this often
STALL_RESTART_FACTOR = 3.0  # stalled this many stall timeouts: the link ends and the worker restarts


class RemoteStream(SynthesisStream):
    """A ``SynthesisStream`` whose chunks come from a worker over a ``WorkerLink``."""

    def __init__(self, link: WorkerLink, req_id: str, sample_rate: int, ahead: float) -> None:
        super().__init__(
            req_id,
            sample_rate,
            credit=ChunkCredit(ahead),
            max_buffered_chunks=link.max_buffered_chunks,
            on_resume=lambda: None,  # the worker is told about every chunk read instead
            on_abort=link.abort,
            on_done=link.forget,
        )
        self._link = link

    async def __anext__(self) -> np.ndarray:
        chunk = await super().__anext__()
        if not self.is_finished:
            self._link.send({"t": p.CREDIT, "id": self.req_id, "n": 1, "samples": int(chunk.size)})
        return chunk

    def set_playback_ahead(self, seconds: float) -> None:
        super().set_playback_ahead(seconds)
        if not self.is_finished:
            self._link.send({"t": p.AHEAD, "id": self.req_id, "s": self._credit.ahead[0]})

    def _receive(self, pcm: bytes) -> bool:
        """A chunk from the worker; False when it breaks the credit bound (a misbehaving worker)."""
        chunk = np.frombuffer(pcm, dtype="<i2").astype(np.int16, copy=False)
        self._credit.num_produced += 1
        self._credit.samples_produced += chunk.size
        if self.num_buffered >= self._max_buffered_chunks:
            return False
        self._push_chunk(chunk)
        return True


class WorkerLink:
    """A connected engine worker: its capabilities (from ``hello``), requests and calls in flight."""

    def __init__(
        self, address: str, *, token: str = "", stall_timeout_s: float = 5.0, ping_interval_s: float = PING_INTERVAL_S
    ) -> None:
        """``token``: sent first (``auth``) to a worker started with one (engine.remote_token);
        ``stall_timeout_s``: engine.worker_stall_timeout_s."""
        self.address = address
        self._token = token
        self.stall_timeout_s = stall_timeout_s
        self.ping_interval_s = ping_interval_s
        self.stalled: str | None = None  # why, while the worker is stalled
        self.stalled_since: float | None = None  # loop time

        self.hello: dict[str, Any] = {}
        self.report: dict[str, Any] = {}
        self.streams: dict[str, RemoteStream] = {}
        self.lost: asyncio.Future[str] | None = None  # resolves with the reason when the link ends
        self.counts = {"requests_total": 0, "chunks_total": 0, "protocol_errors": 0, "outbox_full": 0,
                       "stalls": 0}  # fmt: skip
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._call_ids = itertools.count(1)
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue(OUTBOX_FRAMES)
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # another client of the worker (a second gateway) changed its voice set: the ``voices`` message
        self.on_voices: Callable[[dict[str, Any]], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def connect(self, timeout_s: float) -> None:
        """Open the socket and read the worker's ``hello``; raises ``WorkerLost`` on failure or timeout."""
        kind, where = parse_address(self.address)
        try:
            async with asyncio.timeout(timeout_s):
                if kind == "unix":
                    reader, writer = await asyncio.open_unix_connection(where, limit=p.READ_SIZE)
                else:
                    reader, writer = await asyncio.open_connection(*where, limit=p.READ_SIZE)
                if self._token:
                    writer.write(p.pack({"t": p.AUTH, "token": self._token}))
                    await writer.drain()
                frames = p.FrameReader()
                pending: list[dict[str, Any]] = []
                while not pending:
                    data = await reader.read(p.READ_SIZE)
                    if not data:
                        raise ConnectionError("the worker closed the connection before its hello")
                    pending = frames.feed(data)
        except (OSError, TimeoutError, p.ProtocolError) as exc:
            raise WorkerLost(f"cannot connect to engine worker {self.address}: {exc!r}") from exc
        hello = pending.pop(0)
        if hello.get("t") == p.ERROR:
            writer.close()
            kind, text = hello.get("kind"), str(hello.get("message", ""))[:200]
            raise WorkerLost(f"engine worker {self.address} refused the connection ({kind}): {text}")
        if hello.get("t") != p.HELLO or hello.get("version") != p.PROTOCOL_VERSION:
            writer.close()
            raise WorkerLost(f"engine worker {self.address} speaks another protocol: {hello!r:.200}")
        self.hello = hello
        self.report = {k: hello.get(k) for k in HELLO_REPORT_KEYS}
        self._writer = writer
        self.lost = asyncio.get_running_loop().create_future()
        self._tasks = [
            asyncio.create_task(self._read_in(reader, frames, pending)),
            asyncio.create_task(self._write_out()),
            asyncio.create_task(self._watch()),
        ]

    async def close(self) -> None:
        self._end("closed by the gateway")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def is_up(self) -> bool:
        return self.lost is not None and not self.lost.done()

    @property
    def is_ready(self) -> bool:
        """Up and not stalled: routing may send it requests."""
        return self.is_up and self.stalled is None

    @property
    def max_buffered_chunks(self) -> int:
        return int(self.hello.get("max_buffered_chunks", 8))

    @property
    def capacity(self) -> int:
        return int(self.report.get("capacity") or self.hello.get("max_pending_requests") or 1)

    def free(self) -> int:
        """Free capacity: the worker's latest count (other gateways' requests too) or ours, the larger."""
        reported = int(self.report.get("in_flight") or 0)
        return self.capacity - max(reported, len(self.streams))

    # -- requests --------------------------------------------------------------------------------

    def submit(self, stream: RemoteStream, message: dict[str, Any]) -> None:
        self.streams[stream.req_id] = stream
        self.counts["requests_total"] += 1
        self.send(message)

    def abort(self, req_id: str) -> None:
        self.send({"t": p.ABORT, "id": req_id})

    def forget(self, stream: SynthesisStream) -> None:
        if self.streams.get(stream.req_id) is stream:
            del self.streams[stream.req_id]

    async def call(self, message: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        """Send a voice/health call and wait for its ``result`` (its ``error`` raises; TimeoutError)."""
        if not self.is_up:
            raise WorkerLost(f"engine worker {self.address} is not connected")
        call = next(self._call_ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[call] = future
        self.send({**message, "call": call})
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            self._calls.pop(call, None)

    def send(self, message: dict[str, Any]) -> None:
        if not self.is_up:
            return
        try:
            self._outbox.put_nowait(p.pack(message))
        except asyncio.QueueFull:
            self.counts["outbox_full"] += 1
            self._end(f"send queue full ({OUTBOX_FRAMES} frames): the worker stopped reading")

    # -- tasks -----------------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Ping every ``ping_interval_s``; a stall fails the requests, a long one ends the link."""
        loop = asyncio.get_running_loop()
        while self.is_up:
            sent = loop.time()
            try:
                await self.call({"t": p.HEALTH}, timeout_s=self.stall_timeout_s)
            except TimeoutError:
                self._stall(f"no answer to a ping for {self.stall_timeout_s:g} s")
            except (WorkerLost, EngineError):
                return  # the link ended (its own task says why)
            else:
                step_s = _number(self.report.get("step_running_s"))
                if step_s >= self.stall_timeout_s:
                    self._stall(f"its engine step has been running for {step_s:.1f} s")
                elif self.stalled is not None:
                    log.warning("engine worker %s answers again after a stall (%s)", self.address, self.stalled)
                    self.stalled = self.stalled_since = None
            if self.stalled_since is not None:
                stalled_s = loop.time() - self.stalled_since
                if stalled_s >= STALL_RESTART_FACTOR * self.stall_timeout_s:
                    self._end(f"stalled for {stalled_s:.0f} s ({self.stalled})")
                    return
            await asyncio.sleep(max(0.0, self.ping_interval_s - (loop.time() - sent)))  # the ping timer

    def _stall(self, reason: str) -> None:
        """The worker stopped making progress: not ready, and what it carries fails now (and is aborted
        there, so a worker that wakes up does not finish work nobody waits for)."""
        if self.stalled is not None:
            return
        self.stalled, self.stalled_since = reason, asyncio.get_running_loop().time()
        self.counts["stalls"] += 1
        log.warning(
            "engine worker %s stalled: %s (%d requests in flight fail)", self.address, reason, len(self.streams)
        )
        error = f"engine worker {self.address} stalled: {reason}"
        for stream in list(self.streams.values()):
            stream._push_end(WorkerLost(error))
            self.abort(stream.req_id)
        self.streams.clear()

    async def _write_out(self) -> None:
        assert self._writer is not None
        try:
            while True:
                frame = await self._outbox.get()
                self._writer.write(frame)
                await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._end(f"write failed: {exc!r}")

    async def _read_in(
        self, reader: asyncio.StreamReader, frames: p.FrameReader, pending: list[dict[str, Any]]
    ) -> None:
        reason = "the worker closed the connection"
        try:
            for message in pending:
                self._dispatch(message)
            while data := await reader.read(p.READ_SIZE):
                for message in frames.feed(data):
                    self._dispatch(message)
        except p.ProtocolError as exc:
            self.counts["protocol_errors"] += 1
            reason = f"protocol error: {exc}"
        except (ConnectionError, OSError) as exc:
            reason = f"read failed: {exc!r}"
        self._end(reason)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("t")
        req_id = message.get("id")
        stream = self.streams.get(req_id) if isinstance(req_id, str) else None
        if kind == p.CHUNK:
            pcm = message.get("pcm")
            if stream is not None and isinstance(pcm, bytes):
                self.counts["chunks_total"] += 1
                if not stream._receive(pcm):
                    self.counts["protocol_errors"] += 1
                    stream._push_end(EngineError(f"engine worker {self.address} sent past the credit bound"))
                    self.abort(stream.req_id)
        elif kind == p.END:
            report = message.get("report")
            if isinstance(report, dict):
                self.report = report
            self._note_in_flight(message)
            if stream is not None:
                stream._push_end()
        elif kind == p.ERROR:
            self._note_in_flight(message)
            call = message.get("call")
            if stream is not None:
                stream._push_end(p.error_to_exception(message, stream.req_id))
            elif isinstance(call, int) and call in self._calls:
                future = self._calls[call]
                if not future.done():
                    future.set_exception(p.error_to_exception(message))
            else:
                self.counts["protocol_errors"] += 1
                log.warning(
                    "engine worker %s: %s: %s", self.address, message.get("kind"), message.get("message")
                )
        elif kind == p.REPORT:
            report = message.get("report")
            if isinstance(report, dict):
                self.report = report
        elif kind == p.VOICES:
            if self.on_voices is not None and isinstance(message.get("voices"), list):
                self.on_voices(message)
        elif kind == p.RESULT:
            report = message.get("report")
            if isinstance(report, dict):
                self.report = report
            future = self._calls.get(message.get("call"))  # type: ignore[arg-type]
            if future is not None and not future.done():
                future.set_result(message)
        else:
            self.counts["protocol_errors"] += 1

    def _note_in_flight(self, message: dict[str, Any]) -> None:
        in_flight = message.get("in_flight")
        if isinstance(in_flight, int):
            self.report["in_flight"] = in_flight

    def _end(self, reason: str) -> None:
        """The link is over: fail what is in flight (WorkerLost), resolve ``lost``."""
        if self.lost is None or self.lost.done():
            return
        self.lost.set_result(reason)
        if reason != "closed by the gateway":
            log.warning(
                "engine worker %s lost: %s (%d requests in flight)", self.address, reason, len(self.streams)
            )
        for stream in list(self.streams.values()):
            stream._push_end(WorkerLost(f"engine worker {self.address} went away: {reason}"))
        self.streams.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(WorkerLost(f"engine worker {self.address} went away: {reason}"))
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()


HELLO_REPORT_KEYS = ("state", "capacity", "in_flight", "free", "device", "pid", "steps_total", "memory")


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def summed_memory(links: list[WorkerLink]) -> dict[str, int | float]:
    """The memory figures of the workers' latest reports (plan, use, flow cache), summed over ``links``."""
    total: dict[str, int | float] = {}
    for link in links:
        memory = link.report.get("memory")
        if not isinstance(memory, dict):
            continue
        for key, value in memory.items():
            if isinstance(key, str) and isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    return total
