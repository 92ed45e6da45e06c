"""``python -m tts_engine serve``: one engine worker process (docs/engine-workers.md).

    python -m tts_engine serve --backend cosyvoice --device cuda:0 --listen tcp://0.0.0.0:9100 \
        [--config config.yaml] [--backend-options '{"chunk_ms": 40}'] [--token-file FILE]

Prints ``READY <address>`` on stdout once it accepts connections (the gateway that starts workers
waits for that line), logs to stderr, and stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, BinaryIO

from tts_engine.build import build_engine, read_config
from tts_engine.settings import Settings
from tts_engine.worker.protocol import parse_address
from tts_engine.worker.server import WorkerServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tts_engine")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run one engine worker")
    serve.add_argument(
        "--backend", default=None, help="cosyvoice, fake, gpu-sim, espeak (default: tts.backend)"
    )
    serve.add_argument("--device", default=None, help="cuda:0, cpu... (default: tts.device)")
    serve.add_argument("--listen", required=True, help="unix:PATH or tcp://HOST:PORT")
    serve.add_argument("--config", default=None, help="the gateway's config file (YAML or JSON)")
    serve.add_argument(
        "--config-stdin",
        action="store_true",
        help="read the config as one line of JSON from stdin (how a gateway hands its workers the "
        "tts/engine/gpu sections: no file holds them); implies --exit-on-stdin-eof",
    )
    serve.add_argument(
        "--scratch-dir", default=None, help="where uploaded voice recordings go (default: a temp dir)"
    )
    serve.add_argument("--backend-options", default=None, help="JSON constructor keywords for the backend")
    serve.add_argument(
        "--token-file",
        default=None,
        help="a file holding the token gateways must send first (default: $XZ_ENGINE_TOKEN; none: no check)",
    )
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="stop when stdin closes (the parent gateway is gone)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s worker %(name)s %(levelname)s %(message)s",
    )
    try:
        parse_address(args.listen)
        config = read_config_line(sys.stdin.buffer) if args.config_stdin else read_config(args.config)
        settings = Settings.from_config(config)  # checked now: a bad value stops the worker with its key
        options = json.loads(args.backend_options) if args.backend_options else None
        token = read_token(args.token_file)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if not token and not args.listen.startswith("unix:"):
        logging.getLogger(__name__).warning(
            "no token (--token-file / XZ_ENGINE_TOKEN): anyone who reaches %s can use this engine", args.listen
        )
    backend = args.backend or settings.tts.backend  # one default: tts_engine/settings.py
    if backend == "auto":
        backend = "cosyvoice"
    device = args.device or settings.tts.device
    exit_on_eof = args.exit_on_stdin_eof or args.config_stdin
    asyncio.run(_serve(backend, device, args.listen, settings, options, exit_on_eof, token, args.scratch_dir))
    return 0


MAX_CONFIG_LINE = 1 << 20


def read_config_line(stdin: BinaryIO) -> dict[str, Any]:
    """The config a gateway writes to a worker's stdin: one line of JSON (a mapping), at most 1 MiB."""
    line = stdin.readline(MAX_CONFIG_LINE + 1)
    if not line.endswith(b"\n"):
        raise ValueError("--config-stdin: no complete line of JSON on stdin (at most 1 MiB)")
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("--config-stdin: the config must be a JSON object")
    return data


def read_token(path: str | None) -> str:
    """The worker's token: the first line of ``path``, else ``$XZ_ENGINE_TOKEN``, else none ("")."""
    token = Path(path).read_text(encoding="utf-8").strip() if path else os.environ.get("XZ_ENGINE_TOKEN", "")
    if path and not token:
        raise ValueError(f"{path} holds no token")
    return token


async def _serve(
    backend: str,
    device: str,
    listen: str,
    config: Settings,
    options: dict | None,
    exit_on_stdin_eof: bool,
    token: str = "",
    scratch_dir: str | None = None,
) -> None:
    engine = build_engine(backend, device, config, options)
    await engine.start()
    server = WorkerServer(engine, device=device, listen=listen, token=token, scratch_dir=scratch_dir)
    listener = await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if exit_on_stdin_eof:  # started by a gateway: no orphan outlives it, even after a SIGKILL
        stdin = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
        watcher = asyncio.create_task(stdin.read())
        watcher.add_done_callback(lambda _: stop.set())
    print(f"READY {listen}", flush=True)
    try:
        await stop.wait()
    finally:
        listener.close()
        await server.close()
        await engine.close()


if __name__ == "__main__":
    sys.exit(main())
