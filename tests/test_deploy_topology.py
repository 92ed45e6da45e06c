"""The deploy/ topology on loopback, without Docker: nginx (deploy/nginx.conf) in front of 2 gateway
processes, both using 2 engine worker processes (fake backend) through `engine.remote`; 20 simulated
devices go through nginx (OTA, then the WebSocket URL OTA hands them) and every turn completes.

nginx is an apt package (scripts/setup.sh installs it). Missing, the test fails; set XZ_SKIP_NGINX=1 to
skip it on a machine without nginx. nginx runs unprivileged: a `-p` prefix in a temporary directory, pid,
logs and temp paths there, `daemon off` so the test owns the master process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from scripts.bench_process_stats import worker_steps
from scripts.device_sim import DeviceSimulator, Turn

ROOT = Path(__file__).resolve().parent.parent
NGINX_CONF = ROOT / "deploy" / "nginx.conf"
NUM_GATEWAYS = 2
NUM_WORKERS = 2
NUM_DEVICES = 20
TURNS = 2
MS_PER_CHAR = 80  # the fake backend's default
FRAME_MS = 60
START_TIMEOUT_S = 90  # four Python processes importing torch on two shared cores


def find_nginx() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found:
        return found
    if os.environ.get("XZ_SKIP_NGINX"):
        pytest.skip("nginx is not installed and XZ_SKIP_NGINX is set")
    pytest.fail("nginx is not installed: `apt-get install nginx` (scripts/setup.sh installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_UPSTREAM_SERVER = re.compile(r"^(\s*)server\s+[\w.-]+:\d+(\s[^;]*)?;\s*$")


def loopback_nginx_conf(template: str, *, port: int, gateway_ports: list[int], prefix: Path) -> str:
    """deploy/nginx.conf with its gateways on loopback ports, listening on ``port``, and every file
    nginx writes (pid, error log, temp paths) under ``prefix``, so it runs as any user."""
    out: list[str] = []
    upstreams = listens = 0
    in_run = False
    for line in template.splitlines():
        match = _UPSTREAM_SERVER.match(line)
        if match:
            if not in_run:  # one run of `server` lines per upstream block: replaced by ours
                indent, options = match.group(1), match.group(2) or ""
                out.extend(f"{indent}server 127.0.0.1:{p}{options};" for p in gateway_ports)
                upstreams += 1
            in_run = True
            continue
        in_run = False
        if re.match(r"^\s*listen\s+80;", line):
            out.append(f"        listen 127.0.0.1:{port};")
            listens += 1
        elif re.match(r"^\s*worker_processes\b", line):
            out.append("worker_processes 1;")  # CI has two cores, shared with the gateways
        elif re.match(r"^\s*http\s*\{", line):
            out.append(line)
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
                out.append(f"    {kind}_temp_path {prefix / kind};")
        else:
            out.append(line)
    assert upstreams >= 2 and listens == 1, "deploy/nginx.conf changed shape; update this test"
    header = ["daemon off;", f"pid {prefix / 'nginx.pid'};", f"error_log {prefix / 'error.log'} warn;"]
    if os.geteuid() == 0:
        header.append("user root;")  # else workers run as nobody, who cannot enter pytest's tmp dirs
    return "\n".join(header + out) + "\n"


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def start_worker(port: int, log: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tts_engine", "serve", "--backend", "fake", "--device", "cpu",
        "--listen", f"tcp://127.0.0.1:{port}", "--log-level", "warning",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=log.open("wb"),
    )  # fmt: skip
    return proc


async def worker_ready(proc: asyncio.subprocess.Process, log: Path) -> None:
    """The worker prints `READY <address>` once it accepts connections."""
    assert proc.stdout is not None
    async with asyncio.timeout(START_TIMEOUT_S):
        while True:
            line = await proc.stdout.readline()
            if line.startswith(b"READY"):
                return
            if not line:
                raise AssertionError(f"engine worker exited before READY: {tail(log)}")


async def start_gateway(port: int, worker_ports: list[int], log: Path) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "XZ_ENGINE__REMOTE": json.dumps([f"tcp://127.0.0.1:{p}" for p in worker_ports]),
        "XZ_TTS__BACKEND": "fake",
        "XZ_ASR__BACKEND": "none",
        "XZ_SERVER__LOG_LEVEL": "warning",
        "XZ_SERVER__TRUST_FORWARDED_HEADERS": "true",
        "XZ_SESSION__MEMORY": "none",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port),
        cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip


def all_workers_ready(health: dict) -> bool:
    workers = health.get("engine", {}).get("workers") or []
    return len(workers) == NUM_WORKERS and all(w.get("state") == "ready" for w in workers)


async def http_ready(
    url: str, proc: asyncio.subprocess.Process, log: Path, ready: Callable[[dict], bool] = lambda _: True
) -> None:
    """Waits for ``url`` to answer 200 with a JSON body ``ready`` accepts (nothing to wait on but the
    port: the process is someone else's program)."""
    async with httpx.AsyncClient(timeout=5) as client, asyncio.timeout(START_TIMEOUT_S):
        while True:
            if proc.returncode is not None:
                raise AssertionError(f"{url}: the process exited: {tail(log)}")
            with contextlib.suppress(httpx.TransportError, ValueError):
                reply = await client.get(url)
                if reply.status_code == 200 and ready(reply.json()):
                    return
            await asyncio.sleep(0.25)


@contextlib.asynccontextmanager
async def topology(tmp_path: Path) -> AsyncIterator[tuple[str, list[str], list[int]]]:
    """Yields nginx's URL, the gateways' own URLs and the workers' pids once everything answers."""
    nginx = find_nginx()
    worker_ports = [free_port() for _ in range(NUM_WORKERS)]
    gateway_ports = [free_port() for _ in range(NUM_GATEWAYS)]
    nginx_port = free_port()
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    conf = prefix / "nginx.conf"
    conf.write_text(
        loopback_nginx_conf(
            NGINX_CONF.read_text(), port=nginx_port, gateway_ports=gateway_ports, prefix=prefix
        )
    )
    procs: list[asyncio.subprocess.Process] = []
    try:
        worker_logs = [tmp_path / f"worker-{i}.log" for i in range(NUM_WORKERS)]
        workers = [await start_worker(p, log) for p, log in zip(worker_ports, worker_logs, strict=True)]
        procs += workers
        await asyncio.gather(*(worker_ready(w, log) for w, log in zip(workers, worker_logs, strict=True)))
        gateway_logs = [tmp_path / f"gateway-{i}.log" for i in range(NUM_GATEWAYS)]
        gateways = [
            await start_gateway(p, worker_ports, log)
            for p, log in zip(gateway_ports, gateway_logs, strict=True)
        ]
        procs += gateways
        nginx_proc = await asyncio.create_subprocess_exec(
            nginx, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        procs.append(nginx_proc)
        gateway_urls = [f"http://127.0.0.1:{p}" for p in gateway_ports]
        await asyncio.gather(
            *(
                http_ready(f"{url}/v1/health", proc, log, all_workers_ready)
                for url, proc, log in zip(gateway_urls, gateways, gateway_logs, strict=True)
            )
        )
        nginx_url = f"http://127.0.0.1:{nginx_port}"
        await http_ready(f"{nginx_url}/v1/health", nginx_proc, prefix / "error.log")
        yield nginx_url, gateway_urls, [w.pid for w in workers]
    finally:
        await asyncio.gather(*(stop(p) for p in reversed(procs)))


def assert_complete(turn: Turn, query: str) -> None:
    spoken = "".join(turn.sentences)
    assert query in spoken, f"the reply {spoken!r} does not echo {query!r} (an apology?)"
    # The fake voice speaks MS_PER_CHAR per character; the device got at least 90 % of that in frames.
    expected_ms = len(spoken) * MS_PER_CHAR
    assert len(turn.frames) * FRAME_MS >= 0.9 * expected_ms, (len(turn.frames), expected_ms)


async def run_device(nginx_url: str, index: int) -> None:
    sim = DeviceSimulator(nginx_url, decode=False)
    try:
        ota = await sim.ota()
        assert ota["websocket"]["url"] == nginx_url.replace("http", "ws", 1) + "/xiaozhi/v1/"
        await sim.connect()
        await sim.listen_start("auto")
        for k in range(TURNS):
            query = f"device {index} turn {k}"
            assert_complete(await sim.ask(query, timeout=60), query)
    finally:
        await sim.close()


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_twenty_devices_through_nginx_two_gateways_two_workers(tmp_path: Path) -> None:
    started = time.monotonic()
    async with topology(tmp_path) as (nginx_url, gateway_urls, worker_pids):
        async with asyncio.timeout(90):
            await asyncio.gather(*(run_device(nginx_url, i) for i in range(NUM_DEVICES)))
        async with httpx.AsyncClient(timeout=10) as client:
            metrics = [(await client.get(f"{url}/metrics")).text for url in gateway_urls]
            health = [(await client.get(f"{url}/v1/health")).json() for url in gateway_urls]
        steps = [await worker_steps(pid) for pid in worker_pids]
    sessions = [metric(m, "xz_sessions_total") for m in metrics]
    assert sum(sessions) == NUM_DEVICES and min(sessions) > 0, sessions  # both gateways served devices
    assert [metric(m, "xz_tts_errors_total") for m in metrics] == [0.0] * NUM_GATEWAYS
    for report in health:  # every gateway still has both workers
        assert all_workers_ready(report), report["engine"]
    assert min(steps) > 0, steps  # both workers synthesised (routing spreads the sentences)
    print(f"topology test: {time.monotonic() - started:.1f} s")
