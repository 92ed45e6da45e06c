"""Process measurements for scripts/bench_gateway.py: CPU seconds from /proc, the engine workers a
gateway started, and engine step counters (in process from /metrics, or from each worker's hello)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def child_pids(pid: int, marker: bytes = b"tts_engine") -> list[int]:
    """Processes started by ``pid`` whose command line contains ``marker`` (the engine workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


def cpu_seconds_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


async def worker_steps(pid: int) -> float:
    """An engine worker's step counter: the `report` in the hello it sends on a new connection."""
    from tts_engine.worker.protocol import FrameReader, parse_address

    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    kind, where = parse_address(argv[argv.index("--listen") + 1])
    if kind == "unix":
        reader, writer = await asyncio.open_unix_connection(where)
    else:
        reader, writer = await asyncio.open_connection(*where)
    try:
        frames = FrameReader()
        async with asyncio.timeout(10):
            while True:
                for message in frames.feed(await reader.read(65536)):
                    if message["t"] == "hello":
                        return float(message["steps_total"])
    finally:
        writer.close()


async def engine_steps(url: str, workers: list[int]) -> float:
    """Engine steps so far: the workers' counters, else the in-process engine's (/metrics)."""
    if workers:
        return sum([await worker_steps(pid) for pid in workers])
    import httpx

    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(f"{url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("xz_engine_steps_total")
    )
