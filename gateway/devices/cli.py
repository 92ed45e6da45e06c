"""The operator's command line for devices and agents, straight on the store (``store.url``).

    python -m gateway devices bind CODE [--agent NAME]   # the device that shows CODE, with that agent
    python -m gateway devices list [--state seen|bound] [--limit N] [--json]
    python -m gateway devices show DEVICE_ID [--json]
    python -m gateway devices agent DEVICE_ID NAME       # its agent from its next turn ("default": the config's)
    python -m gateway devices kick DEVICE_ID             # its gateway closes its session (next heartbeat)
    python -m gateway devices delete DEVICE_ID           # forgotten, with its code and memory
    python -m gateway agents list [--json]
    python -m gateway agents show NAME [--json]          # LLM keys masked

It reads the same config as ``serve`` (``--config``, ``XZ_*``) and works on the store directly, so it
works with any number of gateways running (SQLite's file or PostgreSQL), and with none. Exit status:
0 done, 1 refused (unknown code, device or agent), 2 bad config, 3 the store is unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from gateway.agents.profile import DEFAULT_AGENT, default_profile
from gateway.agents.store import AGENTS_SCHEMA, AgentStore
from gateway.config import Config, ConfigError, load_config
from gateway.devices.registry import CodeNotFound, DeviceNotFound, DeviceRecord, DeviceRegistry
from gateway.devices.tables import DEVICES_SCHEMA
from gateway.llm.memory_store import MEMORY_SCHEMA, MemoryStore
from gateway.store import Store, StoreError, StoreUnavailable
from gateway.xiaozhi.handshake import normalize_device_id

__all__ = ["add_arguments", "run"]

CLI_SCHEMAS = (MEMORY_SCHEMA, AGENTS_SCHEMA, DEVICES_SCHEMA)  # gateway/services.py's, without the gateway


def add_arguments(sub: Any) -> None:
    """The ``devices`` and ``agents`` commands on ``python -m gateway``'s subparsers."""
    devices = sub.add_parser("devices", help="the device registry: bind by code, list, kick, delete")
    devices.add_argument("--config", help="config file (default: config.yaml in the project root)")
    dsub = devices.add_subparsers(dest="action", required=True)
    bind = dsub.add_parser("bind", help="bind the device that shows CODE")
    bind.add_argument("code", help="the six digits the device shows and says")
    bind.add_argument("--agent", default=None, help="its agent (default: the config's)")
    listing = dsub.add_parser("list", help="devices, most recently seen first")
    listing.add_argument("--state", choices=("seen", "bound"))
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true")
    show = dsub.add_parser("show", help="one device")
    show.add_argument("device_id")
    show.add_argument("--json", action="store_true")
    agent = dsub.add_parser("agent", help="give a device an agent (from its next turn)")
    agent.add_argument("device_id")
    agent.add_argument("name", help=f"an agent's name ({DEFAULT_AGENT}: the config's)")
    kick = dsub.add_parser("kick", help="close the device's session")
    kick.add_argument("device_id")
    delete = dsub.add_parser("delete", help="forget the device, its code and its memory")
    delete.add_argument("device_id")

    agents = sub.add_parser("agents", help="the agents: list, show")
    agents.add_argument("--config", help="config file (default: config.yaml in the project root)")
    asub = agents.add_subparsers(dest="action", required=True)
    alist = asub.add_parser("list", help="the agents")
    alist.add_argument("--json", action="store_true")
    ashow = asub.add_parser("show", help="one agent (LLM keys masked)")
    ashow.add_argument("name")
    ashow.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(config, args))
    except StoreUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if "schema" in str(exc) or "store.url" in str(exc) else 3
    except (CodeNotFound, DeviceNotFound, LookupError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def _run(config: Config, args: argparse.Namespace) -> int:
    store = Store.from_config(config.store, CLI_SCHEMAS)
    await store.open()
    try:
        if args.command == "devices":
            return await _devices(config, store, args)
        return await _agents(config, store, args)
    finally:
        await store.close()


def _agent_arg(name: str | None) -> str | None:
    return None if name in (None, "", DEFAULT_AGENT) else name


async def _devices(config: Config, store: Store, args: argparse.Namespace) -> int:
    registry = DeviceRegistry(store, config.devices, name="cli")
    device_id = normalize_device_id(getattr(args, "device_id", None))
    if args.action == "bind":
        record = await registry.bind("".join(args.code.split()), _agent_arg(args.agent))
        print(f"bound {record.device_id} to agent {record.agent or DEFAULT_AGENT}: it activates at its next "
              "activation poll and talks with that agent from then on")  # fmt: skip
    elif args.action == "list":
        records = await registry.list_devices(limit=max(1, min(args.limit, 500)), state=args.state)
        _print_devices(records, as_json=args.json)
    elif args.action == "show":
        _print_devices([await registry.get(device_id or "")], as_json=args.json, one=True)
    elif args.action == "agent":
        record = await registry.set_agent(device_id or "", _agent_arg(args.name))
        print(f"{record.device_id}: agent {record.agent or DEFAULT_AGENT} from its next turn")
    elif args.action == "kick":
        if not await registry.kick(device_id or ""):
            raise DeviceNotFound(f"no device {device_id!r}")
        print(f"{device_id}: its gateway closes its session within {config.devices.heartbeat_s:g} s")
    elif args.action == "delete":
        await registry.kick(device_id or "")
        deleted = await registry.delete(device_id or "")
        forgotten = await MemoryStore(store).delete(device_id or "")
        if not (deleted or forgotten):
            raise DeviceNotFound(f"no device {device_id!r}")
        print(f"{device_id}: deleted (it activates anew if it comes back)")
    return 0


async def _agents(config: Config, store: Store, args: argparse.Namespace) -> int:
    agents = AgentStore(store, max_agents=config.agents.max_agents)
    if args.action == "list":
        stored = await agents.list_agents()
        rows = [{"name": DEFAULT_AGENT, "version": 0, "voice": default_profile(config).voice,
                 "model": config.llm.model, "description": "from the config file"}]  # fmt: skip
        rows += [{"name": a.profile.name, "version": a.version, "voice": a.profile.voice,
                  "model": a.profile.llm.model, "description": a.profile.description} for a in stored]  # fmt: skip
        if args.json:
            print(json.dumps(rows, ensure_ascii=False, indent=2))
        else:
            _table(rows, ("name", "version", "voice", "model", "description"))
        return 0
    if args.name == DEFAULT_AGENT:
        data = {**default_profile(config).public(), "version": 0, "read_only": True}
    else:
        found = await agents.get(args.name)
        if found is None:
            raise LookupError(f"no agent {args.name!r}")
        data = found.public()
    print(json.dumps(data, ensure_ascii=False, indent=2))
    return 0


def _print_devices(records: Sequence[DeviceRecord], *, as_json: bool, one: bool = False) -> None:
    if as_json:
        data = [r.public() for r in records]
        print(json.dumps(data[0] if one else data, ensure_ascii=False, indent=2))
        return
    now = time.time()
    rows = [
        {
            "device": r.device_id,
            "state": ("activated" if r.activated_at else r.state) + (" (code)" if r.pending_code else ""),
            "online": "yes" if r.online else "no",
            "agent": r.agent or DEFAULT_AGENT,
            "board": r.board or "",
            "firmware": r.firmware or "",
            "last seen": _ago(now - r.last_seen),
            "latency": f"{r.latency_ms[-1]:.0f} ms" if r.latency_ms else "",
        }
        for r in records
    ]
    _table(rows, ("device", "state", "online", "agent", "board", "firmware", "last seen", "latency"))


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns))
    if not rows:
        print("(none)")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"
