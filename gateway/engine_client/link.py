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
the ``end``, ``result`` and ``report`` frames that carry it sooner). ``RemoteStream`` is a ``SynthesisStream`` fed by the link through its public feed (``receive``,
``finish``): each chunk read is reported back (``credit``) so the worker's engine keeps its
``max_buffered_chunks`` bound and slack ranking end to end; ``set_playback_ahead`` sends the listener's
playback credit as a value. Frames are the typed structs of tts_engine/worker/frames.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Callable

import numpy as np

from tts_engine.errors import EngineError, WorkerLost
from tts_engine.interface import EngineInfo
from tts_engine.request import ChunkCredit, SynthesisStream
from tts_engine.worker import frames as f
from tts_engine.worker import protocol as p

log = logging.getLogger(__name__)

OUTBOX_FRAMES = 4096  # frames waiting for the socket; more means the worker stopped reading: link lost
PING_INTERVAL_S = 1.0  # a ping (``health`` call) to each worker this often
STALL_RESTART_FACTOR = 3.0  # stalled this many stall timeouts: the link ends and the worker restarts
CLOSED_BY_GATEWAY = "closed by the gateway"

Call = f.VoiceAdd | f.VoiceRemove | f.Health


class RemoteStream(SynthesisStream):
    """A ``SynthesisStream`` whose chunks come from a worker over a ``WorkerLink``."""

    def __init__(self, link: WorkerLink, req_id: str, output_rate: int, ahead: float) -> None:
        super().__init__(
            req_id,
            output_rate,
            credit=ChunkCredit(ahead),
            max_buffered_chunks=link.info.max_buffered_chunks,
            on_resume=lambda: None,  # the worker is told about every chunk read instead
            on_abort=link.abort,
            on_done=link.forget,
        )
        self._link = link

    async def __anext__(self) -> np.ndarray:
        chunk = await super().__anext__()
        if not self.is_finished:
            self._link.send(f.Credit(id=self.req_id, n=1, samples=int(chunk.size)))
        return chunk

    def set_playback_ahead(self, seconds: float) -> None:
        super().set_playback_ahead(seconds)
        if not self.is_finished:
            self._link.send(f.Ahead(id=self.req_id, s=self.playback_ahead))


class WorkerLink:
    """A connected engine worker: what it is (``info``, from its hello), its load (``report``), and the
    requests and calls in flight."""

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
        self.hello: f.Hello | None = None
        self.report = f.Report()
        self.streams: dict[str, RemoteStream] = {}
        self.lost: asyncio.Future[str] | None = None  # resolves with the reason when the link ends
        self.counts = {"requests_total": 0, "chunks_total": 0, "protocol_errors": 0, "outbox_full": 0,
                       "stalls": 0}  # fmt: skip
        self._calls: dict[int, asyncio.Future[f.Result]] = {}
        self._call_ids = itertools.count(1)
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue(OUTBOX_FRAMES)
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # another client of the worker (a second gateway) changed its voice set: the ``voices`` message
        self.on_voices: Callable[[f.VoicesChanged], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def connect(self, timeout_s: float) -> None:
        """Open the socket and read the worker's ``hello``; raises ``WorkerLost`` on failure or timeout."""
        kind, where = p.parse_address(self.address)
        try:
            async with asyncio.timeout(timeout_s):
                if kind == "unix":
                    reader, writer = await asyncio.open_unix_connection(where, limit=p.READ_SIZE)
                else:
                    reader, writer = await asyncio.open_connection(*where, limit=p.READ_SIZE)
                if self._token:
                    writer.write(f.encode(f.Auth(token=self._token)))
                    await writer.drain()
                frames = p.FrameReader()
                pending: list[dict[str, object]] = []
                while not pending:
                    data = await reader.read(p.READ_SIZE)
                    if not data:
                        raise ConnectionError("the worker closed the connection before its hello")
                    pending = frames.feed(data)
        except (OSError, TimeoutError, p.ProtocolError) as exc:
            raise WorkerLost(f"cannot connect to engine worker {self.address}: {exc!r}") from exc
        first = pending.pop(0)
        try:
            hello = f.decode(first)
        except f.FrameError as exc:
            writer.close()
            raise WorkerLost(f"engine worker {self.address} speaks another protocol: {exc}") from None
        if isinstance(hello, f.Error):
            writer.close()
            raise WorkerLost(
                f"engine worker {self.address} refused the connection ({hello.kind}): {hello.message[:200]}"
            )
        if not isinstance(hello, f.Hello) or hello.version != p.PROTOCOL_VERSION:
            writer.close()
            raise WorkerLost(f"engine worker {self.address} speaks another protocol: {first!r:.200}")
        self.hello, self.report = hello, hello.report
        self._writer = writer
        self.lost = asyncio.get_running_loop().create_future()
        self._tasks = [
            asyncio.create_task(self._read_in(reader, frames, pending)),
            asyncio.create_task(self._write_out()),
            asyncio.create_task(self._watch()),
        ]

    async def close(self) -> None:
        self._end(CLOSED_BY_GATEWAY)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def info(self) -> EngineInfo:
        if self.hello is None:
            raise WorkerLost(f"engine worker {self.address} is not connected")
        return self.hello.info

    @property
    def is_up(self) -> bool:
        return self.lost is not None and not self.lost.done()

    @property
    def is_ready(self) -> bool:
        """Up and not stalled: routing may send it requests."""
        return self.is_up and self.stalled is None

    @property
    def capacity(self) -> int:
        return self.report.capacity or self.info.max_pending_requests or 1

    def free(self) -> int:
        """Free capacity: the worker's latest count (other gateways' requests too) or ours, the larger."""
        return self.capacity - max(self.report.in_flight, len(self.streams))

    # -- requests --------------------------------------------------------------------------------

    def submit(self, stream: RemoteStream, message: f.Synth) -> None:
        self.streams[stream.req_id] = stream
        self.counts["requests_total"] += 1
        self.send(message)

    def abort(self, req_id: str) -> None:
        self.send(f.Abort(id=req_id))

    def forget(self, stream: SynthesisStream) -> None:
        if self.streams.get(stream.req_id) is stream:
            del self.streams[stream.req_id]

    async def call(self, message: Call, timeout_s: float = 60.0) -> f.Result:
        """Send a voice/health call and wait for its ``result`` (its ``error`` raises; TimeoutError)."""
        if not self.is_up:
            raise WorkerLost(f"engine worker {self.address} is not connected")
        call = next(self._call_ids)
        future: asyncio.Future[f.Result] = asyncio.get_running_loop().create_future()
        self._calls[call] = future
        self.send(dataclasses.replace(message, call=call))
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            self._calls.pop(call, None)

    def send(self, message: f.Frame) -> None:
        if not self.is_up:
            return
        try:
            self._outbox.put_nowait(f.encode(message))
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
                await self.call(f.Health(call=0), timeout_s=self.stall_timeout_s)
            except TimeoutError:
                self._stall(f"no answer to a ping for {self.stall_timeout_s:g} s")
            except EngineError:
                return  # the link ended (its own task says why)
            else:
                step_s = self.report.step_running_s
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
            stream.finish(WorkerLost(error))
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
        self, reader: asyncio.StreamReader, frames: p.FrameReader, pending: list[dict[str, object]]
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

    def _dispatch(self, raw: dict[str, object]) -> None:
        try:
            message = f.decode(raw)
        except f.FrameError as exc:
            self.counts["protocol_errors"] += 1
            log.warning("engine worker %s sent a bad frame: %s", self.address, exc)
            return
        match message:
            case f.Chunk(id=req_id, pcm=pcm):
                stream = self.streams.get(req_id)
                if stream is not None:
                    self.counts["chunks_total"] += 1
                    if not stream.receive(np.frombuffer(pcm, dtype="<i2").astype(np.int16, copy=False)):
                        self.counts["protocol_errors"] += 1
                        stream.finish(EngineError(f"engine worker {self.address} sent past the credit bound"))
                        self.abort(req_id)
            case f.End(id=req_id, in_flight=in_flight, report=report):
                self.report = dataclasses.replace(report or self.report, in_flight=in_flight)
                stream = self.streams.get(req_id)
                if stream is not None:
                    stream.finish()
            case f.Error():
                self._on_error(message)
            case f.VoicesChanged():
                if self.on_voices is not None:
                    self.on_voices(message)
            case f.Result(call=call, report=report):
                if report is not None:
                    self.report = report
                future = self._calls.get(call)
                if future is not None and not future.done():
                    future.set_result(message)
            case f.LoadReport(report=report):
                self.report = report
            case _:
                self.counts["protocol_errors"] += 1

    def _on_error(self, error: f.Error) -> None:
        if error.in_flight is not None:
            self.report = dataclasses.replace(self.report, in_flight=error.in_flight)
        stream = self.streams.get(error.id) if error.id is not None else None
        if stream is not None:
            stream.finish(p.error_to_exception(error, stream.req_id))
        elif error.call is not None and error.call in self._calls:
            future = self._calls[error.call]
            if not future.done():
                future.set_exception(p.error_to_exception(error))
        else:
            self.counts["protocol_errors"] += 1
            log.warning("engine worker %s: %s: %s", self.address, error.kind, error.message)

    def _end(self, reason: str) -> None:
        """The link is over: fail what is in flight (WorkerLost), resolve ``lost``."""
        if self.lost is None or self.lost.done():
            return
        self.lost.set_result(reason)
        if reason != CLOSED_BY_GATEWAY:
            log.warning(
                "engine worker %s lost: %s (%d requests in flight)", self.address, reason, len(self.streams)
            )
        for stream in list(self.streams.values()):
            stream.finish(WorkerLost(f"engine worker {self.address} went away: {reason}"))
        self.streams.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(WorkerLost(f"engine worker {self.address} went away: {reason}"))
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()


def summed_memory(links: list[WorkerLink]) -> dict[str, float]:
    """The memory figures of the workers' latest reports (plan, use, flow cache), summed over ``links``."""
    total: dict[str, float] = {}
    for link in links:
        for key, value in link.report.memory.items():
            total[key] = total.get(key, 0) + value
    return total
