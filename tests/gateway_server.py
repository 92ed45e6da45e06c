"""A real gateway (uvicorn) on a free loopback port, for integration tests.

The server runs in its own thread with its own event loop, so the test's
device clients and the server do not share a loop (arrival times measured by
the clients are not delayed by server work, and vice versa).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
import threading
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import uvicorn

from gateway.app import create_app
from gateway.config import Config, load_config
from gateway.services import Services
from gateway.ws_protocol import WebSocketProtocol
from tts_engine import TTSEngine
from tts_engine.backends.base import Backend

T = TypeVar("T")


@dataclass
class RunningGateway:
    url: str
    services: Services
    loop: asyncio.AbstractEventLoop
    app: Any = None  # the FastAPI app (its state: the MQTT listener when transport.mqtt is on)

    @property
    def ws_url(self) -> str:
        return self.url.replace("http", "ws", 1) + "/xiaozhi/v1/"

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs a coroutine on the server's loop (for objects that live there)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))


@contextlib.asynccontextmanager
async def running_gateway(
    overrides: dict[str, Any] | None = None,
    *,
    backend: Backend | None = None,
    llm: Any = None,
    max_buffered_chunks: int = 8,
) -> AsyncIterator[RunningGateway]:
    # Tests pin ASR off unless they ask for it: `auto` could try to download a model. The engine runs
    # in this process (engine.workers: 0) unless a test asks for worker processes.
    # The store is a SQLite file in a folder of its own, removed at the end, unless the test names one.
    store_dir = tempfile.mkdtemp(prefix="xz-store-")
    base: dict[str, Any] = {
        "asr": {"backend": "none"},
        "engine": {"workers": 0},
        "store": {"url": f"sqlite:///{store_dir}/gateway.db"},
    }
    for key, value in (overrides or {}).items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    try:
        config = load_config(environ={}, overrides=base)
        async with _serving(config, backend, llm, max_buffered_chunks) as gateway:
            yield gateway
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def _serving(
    config: Config, backend: Backend | None, llm: Any, max_buffered_chunks: int
) -> AsyncIterator[RunningGateway]:
    engine = None
    if backend is not None:
        engine = TTSEngine(backend, max_buffered_chunks=max_buffered_chunks)
    services = Services.build(config, engine=engine, llm=llm)
    app = create_app(config, services=services)
    # proto=IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections (no Nagle delays)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until the server accepts
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            ws=WebSocketProtocol,  # what `python -m gateway serve` runs
            ws_per_message_deflate=False,
            ws_ping_interval=None,
            ws_ping_timeout=None,
            lifespan="on",
        )
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(server.serve(sockets=[sock]),), name="gateway", daemon=True
    )
    thread.start()
    gateway_url = f"http://127.0.0.1:{port}"
    await _started(gateway_url)
    try:
        yield RunningGateway(url=gateway_url, services=services, loop=loop, app=app)
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 15)
        sock.close()
        if not thread.is_alive():
            loop.close()


async def _started(url: str, timeout_s: float = 300.0) -> None:
    """Wait out the gateway's start-up (the engine, its voices, the fixed phrases): a first request waits
    in the listen backlog until the server accepts, and is answered once start-up is over. A start-up
    that fails shows in the test's own requests."""
    with contextlib.suppress(httpx.HTTPError):
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            await client.get(f"{url}/v1/health")
