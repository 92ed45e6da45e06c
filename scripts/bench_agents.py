"""What reading a device's agent costs a turn (gateway/agents/active.py: one bounded store read per turn).

    python scripts/bench_agents.py [--devices 1000] [--reads 300] [--url sqlite:///FILE|postgresql://...]

Fills a store (a temporary SQLite file by default) with `--devices` bound devices spread over 10 agents,
then times `Agents.for_device` (the device's row, its agent's profile and its code in one query, the
parsed profile cached by version) for `--reads` random devices, one after another, against a bare
`SELECT 1` through the same store (the floor of any store call). Prints the git commit, the settings and
median / p95 of each, and their ratio (both measured in this run).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from gateway.agents.active import Agents
from gateway.agents.profile import AgentProfile
from gateway.config import load_config
from gateway.devices.registry import DeviceRegistry, DeviceReport
from gateway.services import STORE_SCHEMAS
from gateway.store import Store

ROOT = Path(__file__).resolve().parent.parent


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


async def run(url: str, devices: int, reads: int) -> None:
    config = load_config(environ={}, overrides={"store": {"url": url}})
    store = Store.from_config(config.store, STORE_SCHEMAS)
    await store.open()

    registry = DeviceRegistry(store, config.devices)
    agents = Agents(config, store, registry)
    try:
        for i in range(10):
            await agents.store.create(AgentProfile(name=f"agent-{i}", role_prompt="你是助手。" * 20))
        ids = [f"02:00:00:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}" for i in range(devices)]
        for i, device_id in enumerate(ids):
            await registry.seen(DeviceReport(device_id, board="bench", firmware="1.0"))
            await registry.set_agent(device_id, f"agent-{i % 10}")
        rng = random.Random(0)
        floor, lookup = [], []
        for _ in range(reads):
            started = time.perf_counter()
            async with store.read() as conn:
                await conn.execute(text("SELECT 1"))
            floor.append((time.perf_counter() - started) * 1000)
            device_id = rng.choice(ids)
            started = time.perf_counter()
            agent = await agents.for_device(device_id, wait=False)
            lookup.append((time.perf_counter() - started) * 1000)
            assert agent.name.startswith("agent-"), agent
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()  # fmt: skip
        print(f"commit {commit}; store {store.safe_url}; {devices} bound devices, 10 agents, {reads} reads")
        print(f"SELECT 1          median {statistics.median(floor):.3f} ms  p95 {_pct(floor, 0.95):.3f} ms")
        print(f"agent of a device median {statistics.median(lookup):.3f} ms  p95 {_pct(lookup, 0.95):.3f} ms")
        print(f"ratio (median): {statistics.median(lookup) / statistics.median(floor):.2f}x a bare store call")
    finally:
        await agents.aclose()
        await registry.aclose()
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--url", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xz-bench-agents-") as tmp:
        asyncio.run(run(args.url or f"sqlite:///{tmp}/bench.db", args.devices, args.reads))


if __name__ == "__main__":
    main()
