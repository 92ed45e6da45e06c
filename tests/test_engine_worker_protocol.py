"""The engine worker's wire protocol: framing, bad input, credit, abort (a worker server in this process)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from gateway.api.errors import api_error
from gateway.engine_client.client import EngineClient
from gateway.engine_client.workers import WorkerSlot
from tts_engine import TTSEngine, UnknownVoice
from tts_engine.backends.fake import FakeBackend
from tts_engine.errors import EngineError, EngineUnavailable, SynthesisFailed
from tts_engine.interface import EngineInfo
from tts_engine.voices import VoiceError
from tts_engine.worker import protocol as p
from tts_engine.worker.frames import (
    Abort,
    End,
    Error,
    FrameError,
    Hello,
    Report,
    Synth,
    decode,
    encode,
    markdown_tables,
)
from tts_engine.worker.protocol import parse_address
from tts_engine.worker.server import WorkerServer

RATE = 16000


def test_frames_split_anywhere_decode_whole() -> None:
    data = p.pack({"t": "synth", "id": "a", "pcm": b"\x01" * 1000}) + p.pack({"t": "abort", "id": "a"})
    reader = p.FrameReader()
    got = []
    for i in range(0, len(data), 7):
        got += reader.feed(data[i : i + 7])
    assert [m["t"] for m in got] == ["synth", "abort"]
    assert got[0]["pcm"] == b"\x01" * 1000


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",  # a byte msgpack never uses
        msgpack.packb([1, 2, 3]),  # not a map
        msgpack.packb({"t": 5}),  # a type that is not a string
        msgpack.packb({"no_type": 1}),
    ],
)
def test_malformed_frames_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.FrameReader().feed(data)


def test_an_oversized_frame_is_refused_before_it_is_buffered() -> None:
    reader = p.FrameReader(max_frame_bytes=1024)
    with pytest.raises(p.ProtocolError, match="larger"):
        reader.feed(p.pack({"t": "synth", "pcm": b"\0" * 4096}))


def test_addresses() -> None:
    assert parse_address("unix:/tmp/x.sock") == ("unix", "/tmp/x.sock")
    assert parse_address("tcp://0.0.0.0:9100") == ("tcp", ("0.0.0.0", 9100))
    for bad in ("http://x:1", "tcp://host", "unix:"):
        with pytest.raises(ValueError):
            parse_address(bad)


@contextlib.asynccontextmanager
async def worker(tmp_path: Path, **backend_options: Any) -> AsyncIterator[tuple[WorkerServer, str]]:
    backend_options.setdefault("chunk_ms", 100)
    engine = TTSEngine(FakeBackend(RATE, **backend_options), max_buffered_chunks=3)
    await engine.start()
    address = f"unix:{tmp_path}/w.sock"
    server = WorkerServer(engine, device="cpu", listen=address)
    listener = await server.start()
    try:
        yield server, address
    finally:
        listener.close()
        await engine.close()


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.frames = reader, writer, p.FrameReader()
        self.pending: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, address: str) -> RawClient:
        reader, writer = await asyncio.open_unix_connection(parse_address(address)[1])
        return cls(reader, writer)

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, message: dict[str, Any]) -> None:
        self.writer.write(p.pack(message))

    async def next(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The next frame; None at EOF."""
        async with asyncio.timeout(timeout):
            while not self.pending:
                data = await self.reader.read(65536)
                if not data:
                    return None
                self.pending += self.frames.feed(data)
        return self.pending.pop(0)


async def test_hello_then_chunks_then_end(tmp_path: Path) -> None:
    async with worker(tmp_path) as (_, address):
        client = await RawClient.open(address)
        hello = await client.next()
        assert hello is not None and hello["t"] == "hello" and hello["version"] == p.PROTOCOL_VERSION
        assert hello["backend"] == "fake" and hello["voices"] == ["default"] and hello["capacity"] >= 1
        client.send({"t": "synth", "id": "r1", "text": "hello", "rate": RATE})
        samples = 0
        while (message := await client.next()) is not None and message["t"] == "chunk":
            samples += len(message["pcm"]) // 2
            client.send({"t": "credit", "id": "r1", "n": 1, "samples": len(message["pcm"]) // 2})
        assert message is not None and message["t"] == "end" and message["id"] == "r1"
        assert samples > 0


async def test_bad_input_gets_typed_errors_and_the_connection_stays_up(tmp_path: Path) -> None:
    async with worker(tmp_path) as (_, address):
        client = await RawClient.open(address)
        await client.next()  # hello
        client.send({"t": "dance"})
        error = await client.next()
        assert error is not None and error["t"] == "error" and "unknown message type" in error["message"]
        client.send({"t": "synth", "id": "r1", "text": "hi", "rate": "fast"})
        error = await client.next()
        assert error is not None and error["kind"] == "bad_argument" and error["id"] == "r1"
        client.send({"t": "synth", "id": "r2", "text": "hi", "rate": RATE, "voice": "nobody"})
        error = await client.next()
        assert error is not None and error["kind"] == "unknown_voice" and error["id"] == "r2"
        client.send({"t": "synth", "id": "r3", "text": "hi", "rate": RATE})  # still serving
        assert (await client.next() or {}).get("t") == "chunk"


async def test_undecodable_bytes_close_only_that_connection(tmp_path: Path) -> None:
    async with worker(tmp_path) as (server, address):
        bad = await RawClient.open(address)
        await bad.next()
        bad.send_raw(b"\xc1\xc1\xc1")
        error = await bad.next()
        assert error is not None and error["kind"] == "protocol"
        assert await bad.next() is None  # closed
        assert server.counts["protocol_errors"] == 1
        good = await RawClient.open(address)
        assert (await good.next() or {}).get("t") == "hello"


async def test_the_worker_sends_no_more_than_the_credit_bound(tmp_path: Path) -> None:
    async with worker(tmp_path, ms_per_char=400) as (_, address):  # 16 chunks of 100 ms, made at once
        client = await RawClient.open(address)
        await client.next()
        client.send({"t": "synth", "id": "r1", "text": "abcd", "rate": RATE})
        chunks = [await client.next() for _ in range(3)]  # max_buffered_chunks = 3
        assert all(c is not None and c["t"] == "chunk" for c in chunks)
        with pytest.raises(TimeoutError):
            await client.next(timeout=0.5)  # nothing more until the reader says it consumed some
        client.send({"t": "credit", "id": "r1", "n": 1, "samples": 1600})
        assert (await client.next() or {}).get("t") == "chunk"


async def test_abort_reaches_the_engine_within_one_step(tmp_path: Path) -> None:
    step_s = 0.3
    async with worker(tmp_path, ms_per_char=1000, compute_delay_s=step_s) as (server, address):
        client = EngineClient([WorkerSlot(address)])
        await client.start()
        try:
            stream = client.synthesize("abcdefgh", output_rate=RATE)
            await anext(stream)
            aborted_at = time.monotonic()
            assert client.abort(stream.req_id)
            while server.engine.stats["requests_aborted"] == 0:
                await asyncio.sleep(
                    0.01
                )  # the test watches the worker's engine; the code under test does not poll
            assert time.monotonic() - aborted_at < step_s + 1.5  # the step in progress, then it is gone
            assert server.in_flight() == 0
        finally:
            await client.close()


async def test_client_errors_match_the_in_process_engine(tmp_path: Path) -> None:
    async with worker(tmp_path) as (_, address):
        client = EngineClient([WorkerSlot(address)])
        await client.start()
        try:
            with pytest.raises(UnknownVoice):
                client.synthesize("hi", voice="nobody")
            with pytest.raises(ValueError):
                client.synthesize("hi", output_rate=12345)
            chunks = [c async for c in client.synthesize("hi", output_rate=RATE)]
            assert sum(c.size for c in chunks) > 0
            health = client.health()
            assert health["workers"][0]["state"] == "ready" and health["workers"][0]["address"] == address
        finally:
            await client.close()


async def test_the_playback_credit_reaches_the_workers_engine_as_a_value(tmp_path: Path) -> None:
    async with worker(tmp_path, ms_per_char=1000, compute_delay_s=0.2) as (server, address):
        client = EngineClient([WorkerSlot(address)])
        await client.start()
        try:
            stream = client.synthesize("abcdefgh", output_rate=RATE, playback_ahead=2.0)

            async def worker_side() -> float:
                while True:
                    streams = [s for c in server._connections for s in c.streams.values()]
                    if streams:
                        return streams[0].playback_ahead
                    await asyncio.sleep(0.01)

            assert 1.5 < await asyncio.wait_for(worker_side(), 5) <= 2.0  # decayed since it was set
            stream.set_playback_ahead(5.0)
            async with asyncio.timeout(5):
                while await worker_side() < 4.0:
                    await asyncio.sleep(0.01)
            await stream.aclose()
        finally:
            await client.close()


def test_the_worker_imports_no_web_stack() -> None:
    """A GPU box runs workers with torch, numpy and msgpack only."""
    code = (
        "import sys, tts_engine.__main__, tts_engine.build\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'uvicorn', 'websockets', 'pydantic',"
        " 'starlette', 'gateway', 'yaml'})\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


async def test_a_remote_tcp_worker_is_reconnected_after_it_restarts() -> None:
    """engine.remote: a worker the gateway did not start; when it goes away the slot reconnects."""
    engine = TTSEngine(FakeBackend(RATE, chunk_ms=100))
    await engine.start()
    server = WorkerServer(engine, listen="tcp://127.0.0.1:0")
    listener = await server.start()
    port = listener.sockets[0].getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    slot = WorkerSlot(address)
    client = EngineClient([slot])
    await client.start()
    try:
        assert sum(c.size for c in [c async for c in client.synthesize("hi", output_rate=RATE)]) > 0
        listener.close()
        await server.close()  # the worker goes away...
        async with asyncio.timeout(5):
            while slot.state == "ready":
                await asyncio.sleep(0.01)
        with pytest.raises(EngineUnavailable):
            client.synthesize("hi", output_rate=RATE)  # at once, no hang
        server = WorkerServer(engine, listen=address)  # ...and comes back on the same port
        listener = await server.start()
        async with asyncio.timeout(10):
            while slot.state != "ready":
                await asyncio.sleep(0.01)
        assert sum(c.size for c in [c async for c in client.synthesize("hi", output_rate=RATE)]) > 0
        assert slot.restarts == 1
    finally:
        await client.close()
        listener.close()
        await engine.close()


async def test_a_worker_with_a_token_serves_only_connections_that_send_it(monkeypatch) -> None:
    """engine.remote_token: the auth frame comes first; no hello (voices, capacity) before it."""
    from gateway.engine_client.link import WorkerLink
    from tts_engine.errors import WorkerLost
    from tts_engine.worker import server as worker_server

    monkeypatch.setattr(worker_server, "AUTH_TIMEOUT_S", 0.5)
    engine = TTSEngine(FakeBackend(RATE, chunk_ms=100))
    await engine.start()
    server = WorkerServer(engine, listen="tcp://127.0.0.1:0", token="s3cret-token")
    listener = await server.start()
    address = f"tcp://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    host, port = parse_address(address)[1]
    try:
        # the right token: served as usual
        client = EngineClient([WorkerSlot(address, token="s3cret-token")])
        await client.start()
        try:
            assert sum(c.size for c in [c async for c in client.synthesize("hi", output_rate=RATE)]) > 0
        finally:
            await client.close()
        # a wrong token, no token, or a request first: an unauthorized error, then the socket closes
        with pytest.raises(WorkerLost, match="wrong token"):
            await WorkerLink(address, token="guess").connect(5.0)
        with pytest.raises(WorkerLost, match="no auth frame"):
            await WorkerLink(address).connect(5.0)
        reader, writer = await asyncio.open_connection(host, port)
        raw = RawClient(reader, writer)
        raw.send({"t": "synth", "id": "r1", "text": "hello", "rate": RATE})
        refused = await raw.next()
        assert refused is not None and refused["t"] == "error" and refused["kind"] == "unauthorized"
        assert await raw.next() is None  # closed: no hello, no chunks
        writer.close()
        assert server.counts["auth_failures"] == 3
    finally:
        listener.close()
        await server.close()
        await engine.close()


async def test_a_worker_without_a_token_accepts_a_client_that_sends_one(tmp_path: Path) -> None:
    async with worker(tmp_path) as (_, address):
        client = EngineClient([WorkerSlot(address, token="unused")])
        await client.start()
        try:
            assert sum(c.size for c in [c async for c in client.synthesize("hi", output_rate=RATE)]) > 0
        finally:
            await client.close()


@pytest.mark.parametrize(
    ("cause", "kind", "status"),
    [(ValueError("text is 2470 characters, the limit is 2000"), ValueError, 400),
     (VoiceError("zero-shot prompt: too short"), VoiceError, 400),
     (RuntimeError("CUDA error: out of memory"), EngineError, 500)],
)  # fmt: skip
def test_a_failed_requests_cause_crosses_the_boundary_typed(cause, kind, status):
    # issue 23: the cause used to arrive as EngineError(repr(cause)): every backend refusal became a 500
    frame = decode(p.FrameReader().feed(encode(p.error_frame(SynthesisFailed("r1", cause), id="r1")))[0])
    assert isinstance(frame, Error)
    error = p.error_to_exception(frame, "r1")
    assert isinstance(error, SynthesisFailed) and type(error.cause) is kind and str(error.cause) == str(cause)
    in_process = api_error(SynthesisFailed("r1", cause))
    assert api_error(error).status_code == in_process.status_code == status
    assert api_error(error).code == in_process.code


def test_the_frame_tables_in_the_docs_are_the_structs() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "engine-workers.md").read_text(encoding="utf-8")
    begin = doc.index("-->\n", doc.index("<!-- frames:")) + len("-->\n")
    assert doc[begin : doc.index("\n<!-- /frames -->")] == markdown_tables()


def test_every_frame_round_trips_and_a_bad_field_is_named() -> None:
    report = Report(capacity=4, in_flight=1, memory={"kv_slots": 4, "flow_cache_bytes": 1.5})
    samples = [
        Synth(id="r", text="hi", rate=RATE, voice="v", prompt_wav=b"RIFF"),
        Hello(version=p.PROTOCOL_VERSION, info=EngineInfo(backend="fake", sample_rate=24000, max_text_chars=10),
              voices=["a"], default_voice="a", report=report),  # fmt: skip
        End(id="r", in_flight=0, report=report),
        Error(kind="unknown_voice", message="m", id="r", available=["a", "b"]),
    ]
    for item in samples:
        assert decode(p.FrameReader().feed(encode(item))[0]) == item
    with pytest.raises(FrameError, match="field 'rate' must be an integer"):
        decode({"t": "synth", "id": "r", "text": "hi", "rate": True})
    with pytest.raises(FrameError, match="field 'text' is missing"):
        decode({"t": "synth", "id": "r", "rate": RATE})
    assert decode({"t": "abort", "id": "r", "from_the_future": 1}) == Abort(id="r")  # unknown keys: ignored
