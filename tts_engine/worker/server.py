"""One TTSEngine served over a stream socket (unix or TCP) to any number of gateway connections.

Per connection: a reader task decodes frames (tts_engine/worker/protocol.py, typed structs in
frames.py) and dispatches them; one task per request forwards its chunks as they are ready; one
writer task drains a bounded outbound queue into the socket (``await writer.drain()``: a slow reader
slows its forwarders, never the engine thread). Each request's stream runs with deferred credit: a
chunk counts as consumed when the client says so (``credit``), so the engine's
``max_buffered_chunks`` bound and its slack ranking hold end to end. A connection that goes away aborts
its requests. Bad input gets an ``error`` frame; only an undecodable byte stream closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tts_engine.arguments import check_priority
from tts_engine.engine import TTSEngine
from tts_engine.request import SynthesisStream
from tts_engine.voices import VoicePreset, check_voice_name
from tts_engine.worker import frames as f
from tts_engine.worker import protocol as p

log = logging.getLogger(__name__)

OUTBOX_FRAMES = 1024  # frames queued for one connection's socket before forwarders wait
FLUSH_TIMEOUT_S = 2.0  # a closing connection's queued frames get this long to go out
AUTH_TIMEOUT_S = 5.0  # a worker with a token waits this long for a connection's auth frame


class WorkerServer:
    def __init__(
        self,
        engine: TTSEngine,
        *,
        device: str = "cpu",
        listen: str = "",
        token: str = "",
        scratch_dir: str | Path | None = None,
    ) -> None:
        """``token``: when set, a connection must send it in an ``auth`` frame before anything else.
        ``scratch_dir``: where voice recordings sent with ``voice_add`` are written (a folder of the
        gateway that started this worker); else a temp dir of its own, removed at ``close()``."""
        self.engine = engine
        self.device = device
        self.listen = listen
        self.token = token
        if scratch_dir is not None:
            self._voice_dir = Path(scratch_dir) / f"voices-{os.getpid()}"
            self._voice_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        else:
            self._voice_dir = Path(tempfile.mkdtemp(prefix="tts-worker-voices-"))
        self._connections: set[_Connection] = set()
        self.counts = {"connections_total": 0, "protocol_errors": 0, "outbox_full_waits": 0, "auth_failures": 0}
        self._report_due = False  # a ``report`` to every connection is scheduled for this loop tick

    # -- reports ---------------------------------------------------------------------------------

    def in_flight(self) -> int:
        return sum(len(c.streams) for c in self._connections)

    def report(self, leaving: int = 0) -> f.Report:
        """Load, steps and memory; ``leaving``: requests about to end, not counted as in flight."""
        health = self.engine.health()  # once: a report goes out with every request's end
        capacity = int((health.get("batching") or {}).get("capacity") or self.engine.max_pending_requests)
        in_flight = max(0, self.in_flight() - leaving)
        return f.Report(
            state=str(health.get("state", "running")),
            capacity=capacity,
            in_flight=in_flight,
            free=max(0, capacity - in_flight),
            queue_depth=int(health.get("queue_depth", 0)),
            connections=len(self._connections),
            pid=os.getpid(),
            device=self.device,
            steps_total=int((health.get("stats") or {}).get("steps_total", 0)),  # scripts/bench_gateway.py
            # how long the engine's current step has run (0 between steps): gateways take a step far
            # longer than any should for a stuck engine (docs/engine-workers.md, "Stalls")
            step_running_s=round(float(health.get("step_running_s") or 0.0), 3),
            # the engine's memory plan and use (flow cache included): /v1/health and /metrics of the gateway
            memory={k: v for k, v in (health.get("memory") or {}).items() if _is_number(v)},
            **self.counts,
        )

    def hello(self) -> f.Hello:
        engine = self.engine
        return f.Hello(version=p.PROTOCOL_VERSION, info=engine.info, voices=engine.voices,
                       default_voice=engine.default_voice, report=self.report())  # fmt: skip

    # -- serving ---------------------------------------------------------------------------------

    async def start(self) -> asyncio.AbstractServer:
        """Listen on ``self.listen`` (``unix:PATH`` or ``tcp://HOST:PORT``); returns the server."""
        kind, where = p.parse_address(self.listen)
        if kind == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(where)
            return await asyncio.start_unix_server(self._serve, path=where, limit=p.READ_SIZE)
        host, port = where
        return await asyncio.start_server(self._serve, host, port, limit=p.READ_SIZE)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(self, reader, writer)
        self._connections.add(connection)
        self.counts["connections_total"] += 1
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)
            connection.finished.set()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Drop every connection (their requests abort), wait for their tasks to finish, remove the
        voice recordings written here."""
        for connection in list(self._connections):
            connection.writer.transport.abort()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._connections:
                    await next(iter(self._connections)).finished.wait()
        shutil.rmtree(self._voice_dir, ignore_errors=True)

    def load_changed(self) -> None:
        """Requests left without an ``end`` (aborted, or their connection went away): tell every connection
        the new load at the end of this loop tick (one ``report`` however many left in it), so each
        gateway's routing sees the worker's real in-flight count at once, not at its next request's end."""
        if self._report_due:
            return
        self._report_due = True
        asyncio.get_running_loop().call_soon(self._send_report)

    def _send_report(self) -> None:
        self._report_due = False
        message = f.LoadReport(report=self.report())
        for connection in list(self._connections):
            if connection.greeted and not connection.closing:
                connection.spawn(connection.send(message))

    def voices_changed(self, change: str, name: str, *, origin: _Connection) -> None:
        """Tell every other connection (other gateways) that ``origin`` changed the voice set."""
        engine = self.engine
        message = f.VoicesChanged(change=change, name=name, voices=engine.voices, default_voice=engine.default_voice)
        for connection in self._connections:
            if connection is not origin and connection.greeted:
                connection.spawn(connection.send(message))  # through its bounded outbox, in order

    def voice_path(self, name: str) -> Path:
        return self._voice_dir / f"{check_voice_name(name)}.wav"


class _Connection:
    def __init__(
        self, server: WorkerServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.engine = server.engine
        self.reader = reader
        self.writer = writer
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue(OUTBOX_FRAMES)
        self.streams: dict[str, SynthesisStream] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.finished = asyncio.Event()
        self.greeted = False  # authenticated (where a token is needed) and sent the hello
        self.closing = False  # its reader ended: nothing more is queued for it

    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_out())
        try:
            if self.server.token and not await self._authenticate():
                return
            await self.send(self.server.hello())
            self.greeted = True
            await self._read_in()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closing = True
            had_requests = bool(self.streams)
            for stream in list(self.streams.values()):
                await stream.aclose()  # the client went away: its requests stop in the engine
            self.streams.clear()
            if had_requests:
                self.server.load_changed()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            with contextlib.suppress(TimeoutError):  # what is queued (a last error frame) goes out first
                async with asyncio.timeout(FLUSH_TIMEOUT_S):
                    await self.outbox.put(None)
                    await asyncio.gather(writer_task, return_exceptions=True)
            writer_task.cancel()
            await asyncio.gather(writer_task, return_exceptions=True)
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def send(self, message: f.Frame) -> None:
        if self.outbox.full():
            self.server.counts["outbox_full_waits"] += 1
        await self.outbox.put(f.encode(message))

    async def _write_out(self) -> None:
        while (frame := await self.outbox.get()) is not None:
            self.writer.write(frame)
            await self.writer.drain()

    async def _authenticate(self) -> bool:
        """The connection's first frame must be ``auth`` with the worker's token (constant-time compare)."""
        frames = p.FrameReader(max_frame_bytes=p.MAX_AUTH_FRAME_BYTES)
        messages: list[dict[str, Any]] = []
        reason = "no auth frame"
        try:
            async with asyncio.timeout(AUTH_TIMEOUT_S):
                while not messages:
                    data = await self.reader.read(p.MAX_AUTH_FRAME_BYTES)
                    if not data:
                        return False
                    messages = frames.feed(data)
        except TimeoutError:
            reason = f"no auth frame within {AUTH_TIMEOUT_S:.0f} s"
        except p.ProtocolError as exc:
            reason = f"bad auth frame: {exc}"
        if messages:
            try:
                first = f.decode(messages[0])
            except f.FrameError as exc:
                reason = f"bad auth frame: {exc}"
            else:
                if isinstance(first, f.Auth):
                    if hmac.compare_digest(first.token.encode(), self.server.token.encode()):
                        return True
                    reason = "wrong token"
        self.server.counts["auth_failures"] += 1
        peer = self.writer.get_extra_info("peername")
        log.warning("refused an engine connection from %s: %s", peer or "a unix socket", reason)
        await self.send(f.Error(kind=p.UNAUTHORIZED, message=reason))
        return False

    async def _read_in(self) -> None:
        frames = p.FrameReader()
        while data := await self.reader.read(p.READ_SIZE):
            try:
                messages = frames.feed(data)
            except p.ProtocolError as exc:
                self.server.counts["protocol_errors"] += 1
                log.warning("closing an engine connection: %s", exc)
                await self.send(p.error_frame(exc))
                return
            for message in messages:
                try:
                    await self._dispatch(f.decode(message))
                except Exception as exc:  # noqa: BLE001 - a bad frame never takes the worker down
                    self.server.counts["protocol_errors"] += 1
                    req_id, call = message.get("id"), message.get("call")
                    await self.send(p.error_frame(exc, id=req_id if isinstance(req_id, str) else None,
                                                  call=call if isinstance(call, int) else None))  # fmt: skip

    async def _dispatch(self, message: f.Frame) -> None:
        match message:
            case f.Credit(id=req_id, n=n, samples=samples):
                stream = self.streams.get(req_id)
                if stream is not None:
                    stream.credit_consumed(_count(n, "n"), _count(samples, "samples"))
            case f.Ahead(id=req_id, s=seconds):
                stream = self.streams.get(req_id)
                if stream is not None:
                    stream.set_playback_ahead(seconds)
            case f.Synth():
                self._start_request(message)
            case f.Auth():
                pass  # a token sent to a worker that checks none (or a repeat after it was checked)
            case f.Abort(id=req_id):
                stream = self.streams.pop(req_id, None)
                if stream is not None:
                    await stream.aclose()
                    self.server.load_changed()
            case f.VoiceAdd() | f.VoiceRemove() | f.Health():
                self.spawn(self._answer_call(message))
            case _:
                raise ValueError(f"a {message.T!r} frame is not one a worker takes")

    def _start_request(self, synth: f.Synth) -> None:
        req_id = _nonempty(synth.id, "id")
        if req_id in self.streams:
            raise ValueError(f"request id {req_id!r} is already in use")
        options: dict[str, Any] = {
            "output_rate": synth.rate,
            "speed": synth.speed,
            "instruct": synth.instruct,
            "req_id": f"{id(self):x}-{req_id}",
            "priority": check_priority(synth.priority),
        }
        if synth.prompt_wav is not None:
            stream = self.engine.synthesize_zero_shot(
                synth.text, prompt_wav=synth.prompt_wav, prompt_text=synth.prompt_text, **options
            )
        else:
            stream = self.engine.synthesize(synth.text, voice=synth.voice, playback_ahead=synth.ahead, **options)
        stream.defer_credit()
        self.streams[req_id] = stream
        self.spawn(self._forward(req_id, stream))

    async def _forward(self, req_id: str, stream: SynthesisStream) -> None:
        try:
            async for chunk in stream:
                await self.send(f.Chunk(id=req_id, pcm=chunk.astype("<i2", copy=False).tobytes()))
        except Exception as exc:  # noqa: BLE001 - the request's own failure goes to its client
            await self.send(p.error_frame(exc, id=req_id, in_flight=self.server.in_flight()))
        else:
            if not stream.is_aborted:
                report = self.server.report(leaving=1)
                await self.send(f.End(id=req_id, in_flight=report.in_flight, report=report))
        finally:
            if self.streams.get(req_id) is stream:
                del self.streams[req_id]

    async def _answer_call(self, message: f.VoiceAdd | f.VoiceRemove | f.Health) -> None:
        reply: f.Frame
        try:
            if isinstance(message, f.VoiceAdd):
                await self._add_voice(message)
            elif isinstance(message, f.VoiceRemove):
                await self.engine.remove_voice(_nonempty(message.name, "name"))
            reply = f.Result(call=message.call, voices=self.engine.voices, default_voice=self.engine.default_voice,
                             report=self.server.report())  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - answered as an error frame
            reply = p.error_frame(exc, call=message.call)
        else:
            if isinstance(message, f.VoiceAdd | f.VoiceRemove):
                change = "add" if isinstance(message, f.VoiceAdd) else "remove"
                self.server.voices_changed(change, message.name, origin=self)
        await self.send(reply)

    async def _add_voice(self, message: f.VoiceAdd) -> None:
        name = _nonempty(message.name, "name")
        path = None
        if message.prompt_wav is not None:
            path = self.server.voice_path(name)
            await asyncio.to_thread(path.write_bytes, message.prompt_wav)
        preset = VoicePreset(name=name, prompt_wav=path, prompt_text=message.prompt_text,
                             instruct=message.instruct, description=message.description)  # fmt: skip
        await self.engine.add_voice(preset)

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def _nonempty(value: str, name: str) -> str:
    if not value:
        raise ValueError(f"field {name!r} must be a non-empty string")
    return value


def _count(value: int, name: str) -> int:
    if value < 0:
        raise ValueError(f"field {name!r} must be a non-negative integer")
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
