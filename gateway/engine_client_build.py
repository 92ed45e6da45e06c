"""Build the ``EngineClient`` that ``engine.workers`` / ``engine.remote`` ask for (gateway/services.py).

Local workers listen on unix sockets in a private temp dir (mode 0700, removed at close) and read the
gateway's own config, written there as JSON, so a worker and its gateway always agree on the settings.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from gateway.config import Config
from gateway.engine_client import EngineClient
from gateway.engine_client_workers import WorkerCommand, WorkerSlot
from tts_engine.worker.server import parse_address


def worker_devices(config: Config) -> list[str]:
    """One device per worker: ``auto`` is one per visible CUDA GPU (one on CPU), times workers_per_device."""
    engine, configured = config.engine, config.tts.device
    if configured in ("auto", "cuda") and torch.cuda.is_available():
        devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    else:
        devices = ["cpu" if configured == "auto" else configured]
    count = len(devices) * engine.workers_per_device if engine.workers == "auto" else int(engine.workers)
    return [devices[i % len(devices)] for i in range(count)]


def build_engine_client(config: Config, backend: str) -> EngineClient:
    engine = config.engine
    options = {
        "connect_timeout_s": engine.worker_connect_timeout_s,
        "start_timeout_s": engine.worker_start_timeout_s,
        "max_restarts": engine.worker_max_restarts,
    }
    if engine.remote:
        for address in engine.remote:
            parse_address(address)  # a bad entry stops the start with its name (ValueError)
        slots = [WorkerSlot(address, token=engine.remote_token, **options) for address in engine.remote]
        return EngineClient(slots, max_pending_requests=config.tts.max_pending_requests)
    run_dir = Path(tempfile.mkdtemp(prefix="xz-engine-"))
    os.chmod(run_dir, 0o700)
    config_path = run_dir / "config.json"
    config_path.write_text(json.dumps(config.model_dump(mode="json")), encoding="utf-8")
    backend_options = json.dumps(engine.worker_backend_options) if engine.worker_backend_options else None
    slots = [
        WorkerSlot(
            f"unix:{run_dir}/worker-{index}.sock",
            command=WorkerCommand(backend, device, str(config_path), backend_options),
            **options,
        )
        for index, device in enumerate(worker_devices(config))
    ]
    client = EngineClient(
        slots,
        max_pending_requests=config.tts.max_pending_requests,
        start_timeout_s=engine.worker_start_timeout_s,
    )
    client.on_closed = lambda: shutil.rmtree(run_dir, ignore_errors=True)
    return client
