"""`python -m gateway serve [--config FILE] [--host H] [--port P]`; `python -m gateway check [--config FILE]
[--no-synth] [--json] [--verbose]` (what works with the configured models, docs/check.md);
`python -m gateway devices bind CODE [--agent NAME]` and the other `devices` / `agents` commands
(gateway/devices/cli.py, docs/devices-and-agents.md); `python -m gateway keys add|list|revoke|usage`
(API keys in the store, gateway/keys_cli.py)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from gateway.config import ConfigError, load_config


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.security.log_redaction import install_log_redaction
    from gateway.ws_protocol import WebSocketProtocol

    overrides: dict = {"server": {}}
    if args.host:
        overrides["server"]["host"] = args.host
    if args.port is not None:
        overrides["server"]["port"] = args.port
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_log_redaction()  # credentials in query strings never reach uvicorn's logs
    try:
        app = create_app(config)
    except ConfigError as exc:  # e.g. an unreadable server.auth.secret_file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(
        app,
        host=config.server.host,
        port=config.server.port,
        log_level=config.server.log_level,
        ws=WebSocketProtocol,  # websockets-sansio, without its spurious ERROR after a refused handshake
        ws_per_message_deflate=False,  # devices do not negotiate it; keep frames plain
        ws_ping_interval=None,  # ESP32s answer pings late; idle timeouts live in the session
        ws_ping_timeout=None,
        ws_max_size=1 << 20,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway", description="Xiaozhi voice gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--config", help="config file (default: config.yaml in the project root)")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides server.port)")
    check = sub.add_parser("check", help="load every configured model, speak and recognise one sentence")
    from gateway.checks import report as check_report

    check_report.add_arguments(check)
    from gateway.devices import cli as devices_cli

    devices_cli.add_arguments(sub)

    from gateway import keys_cli

    keys_cli.add_arguments(sub.add_parser("keys", help="API keys in the store: add, list, revoke, usage"))
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "check":
        return check_report.run(args)
    if args.command in ("devices", "agents"):
        return devices_cli.run(args)
    if args.command == "keys":
        return keys_cli.run(args)
    return 2


if __name__ == "__main__":
    code = main()
    if sys.argv[1:2] == ["check"]:
        # The report is out: skip the interpreter's teardown, where a native thread pool (torch or
        # onnxruntime) now and then aborts the process ("terminate called without an active exception").
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
