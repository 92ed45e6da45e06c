"""Build the ``EngineClient`` that ``engine.workers`` / ``engine.remote`` ask for (gateway/services.py).

Local workers listen on unix sockets in a private run folder (``xz-engine-<pid>-*`` in the temp dir,
mode 0700, removed at close) and get their settings on stdin: the ``tts``, ``engine`` and ``gpu``
sections of the gateway's own config, one line of JSON (``--config-stdin``), so a worker and its
gateway always agree, and nothing else of the config (no API keys, device secrets, LLM key) reaches
the worker or any file. The run folder holds a ``lock`` that the gateway keeps locked (``flock``) for
its lifetime; at start-up a gateway removes the run folders whose lock nobody holds any more (gateways
killed with SIGKILL), and those of older versions that left their config file there.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch

from gateway.config import Config
from gateway.engine_client.client import EngineClient
from gateway.engine_client.workers import WorkerCommand, WorkerSlot
from tts_engine.worker.protocol import parse_address

log = logging.getLogger(__name__)

RUN_DIR_PREFIX = "xz-engine-"
LOCK_NAME = "lock"
# engine keys a local worker has no use for (and one secret it must not see)
GATEWAY_ONLY_ENGINE_KEYS = ("remote", "remote_token")


def worker_devices(config: Config) -> list[str]:
    """One device per worker: ``auto`` is one per visible CUDA GPU (one on CPU), times workers_per_device."""
    engine, configured = config.engine, config.tts.device
    if configured in ("auto", "cuda") and torch.cuda.is_available():
        devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    else:
        devices = ["cpu" if configured == "auto" else configured]
    count = len(devices) * engine.workers_per_device if engine.workers == "auto" else int(engine.workers)
    return [devices[i % len(devices)] for i in range(count)]


def worker_config(config: Config) -> dict[str, Any]:
    """What a local worker reads: the ``tts``, ``engine`` and ``gpu`` sections, without the gateway's
    own engine keys (remote addresses and their token)."""
    engine = config.engine.model_dump(mode="json")
    for key in GATEWAY_ONLY_ENGINE_KEYS:
        engine.pop(key, None)
    return {"tts": config.tts.model_dump(mode="json"), "engine": engine,
            "gpu": config.gpu.model_dump(mode="json")}  # fmt: skip


def build_engine_client(config: Config, backend: str) -> EngineClient:
    engine = config.engine

    def slot(address: str, *, token: str = "", command: WorkerCommand | None = None) -> WorkerSlot:
        return WorkerSlot(address, command=command, token=token, connect_timeout_s=engine.worker_connect_timeout_s,
                          start_timeout_s=engine.worker_start_timeout_s, max_restarts=engine.worker_max_restarts,
                          stall_timeout_s=engine.worker_stall_timeout_s)  # fmt: skip

    if engine.remote:
        for address in engine.remote:
            parse_address(address)  # a bad entry stops the start with its name (ValueError)
        slots = [slot(address, token=engine.remote_token) for address in engine.remote]
        return EngineClient(slots, max_pending_requests=config.tts.max_pending_requests)
    remove_stale_run_dirs()
    run_dir, lock = make_run_dir()
    backend_options = engine.worker_backend_options or None
    settings = worker_config(config)
    slots = [
        slot(f"unix:{run_dir}/worker-{index}.sock",
             command=WorkerCommand(backend, device, settings, str(run_dir), backend_options))  # fmt: skip
        for index, device in enumerate(worker_devices(config))
    ]
    client = EngineClient(
        slots,
        max_pending_requests=config.tts.max_pending_requests,
        start_timeout_s=engine.worker_start_timeout_s,
    )

    def remove_run_dir() -> None:
        shutil.rmtree(run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(lock)

    client.on_closed = remove_run_dir
    return client


def make_run_dir() -> tuple[Path, int]:
    """A private run folder for this gateway's worker sockets, and the fd of its held lock."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-"))
    os.chmod(run_dir, 0o700)
    fd = os.open(run_dir / LOCK_NAME, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until this process ends (or the client closes)
    return run_dir, fd


def remove_stale_run_dirs(temp_dir: str | Path | None = None) -> list[Path]:
    """Remove the run folders of gateways that are gone (their lock is free); returns what was removed.

    A folder of an older version has no lock but a ``config.json`` (it held the whole config, secrets
    included): it is removed when none of its sockets accepts a connection. A folder with neither is
    one a gateway is creating right now and is left alone.
    """
    removed = []
    for path in Path(temp_dir or tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*"):
        try:
            if not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            if _is_stale(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except OSError:
            continue
    if removed:
        log.info("removed %d engine run folder(s) of gateways no longer running", len(removed))
    return removed


def _is_stale(path: Path) -> bool:
    lock = path / LOCK_NAME
    if lock.exists():
        fd = os.open(lock, os.O_WRONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live gateway holds it
        finally:
            os.close(fd)
        return True
    if not (path / "config.json").exists():
        return False
    return not any(_accepts(sock) for sock in path.glob("*.sock"))


def _accepts(sock_path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(str(sock_path))
        except OSError:
            return False
        return True
