"""The gateway of scripts/bench_gateway.py (and scripts/bench_service.py) in its own process, so that its
CPU time can be read from /proc: a free port, the server started and stopped, its health awaited."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["free_port", "server_process", "wait_ready"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(backend: str, port: int, extra_env: dict[str, str]):
    env = {**os.environ, "XZ_TTS__BACKEND": backend, "XZ_SERVER__LOG_LEVEL": "warning", **extra_env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def wait_ready(url: str, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(f"{url}/v1/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            await asyncio.sleep(0.2)
