"""``python -m gateway keys add|list|revoke|usage``: API keys in the store (gateway/service/accounts.py).

    python -m gateway keys add NAME [--admin] [--rps R] [--burst B] [--chars-per-minute C] [--streams S]
                                    [--quota-chars N | --quota-audio-s SEC] [--quota-period day|month]
                                    [--priority interactive|batch] [--voice V ...] [--add-voice V ...]
                                    [--no-cache]
    python -m gateway keys list [--all]
    python -m gateway keys revoke NAME
    python -m gateway keys usage [NAME] [--days N] [--json]

``add`` prints the key once (only its SHA-256 is kept) on stdout, alone on its line, and what it may do
on stderr, so ``KEY=$(python -m gateway keys add NAME)`` works. The store is the one ``store.url`` names
(the same the gateway uses; a running gateway sees a new key at once and a revoked one within
``service.key_refresh_s``). Exit codes: 0 done, 1 not found or name taken, 2 bad arguments or config,
3 the store is unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable

from gateway.config import ConfigError, load_config
from gateway.service.accounts import Account, KeyStore, Limits, check_key_name
from gateway.service.usage import UsageMeter, key_subject
from gateway.store import Store, StoreConflict, StoreError, StoreUnavailable

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file (default: config.yaml in the project root)")
    sub = parser.add_subparsers(dest="keys_command", required=True)
    add = sub.add_parser("add", help="make a key (printed once) with optional limits")
    add.add_argument("name", help="the key's name: the label of its usage and metrics ([A-Za-z0-9_.@-]{1,64})")
    add.add_argument("--admin", action="store_true", help="may see every key's usage and every batch job")
    add.add_argument("--rps", type=float, help="requests per second (token bucket)")
    add.add_argument("--burst", type=int, help="requests at once (default: the rps rounded, at least 1)")
    add.add_argument("--chars-per-minute", type=int, help="characters of text per minute")
    add.add_argument("--streams", type=int, help="speech requests in flight at once")
    add.add_argument("--quota-chars", type=int, help="characters per quota period")
    add.add_argument("--quota-audio-s", type=float, help="seconds of audio per quota period")
    add.add_argument("--quota-period", choices=["day", "month"], default="day", help="UTC day or month")
    add.add_argument("--priority", choices=["interactive", "batch"], default="interactive",
                     help="the engine class of its API streams (batch: only what device turns and others leave)")
    add.add_argument("--voice", action="append", default=[], help="a voice it may use (repeat; default: all)")
    add.add_argument("--add-voice", action="append", default=[],
                     help="a voice name it may add, replace or delete (repeat; '*': any)")
    add.add_argument("--no-cache", action="store_true", help="its requests skip the audio cache")
    lst = sub.add_parser("list", help="the keys (never the keys themselves)")
    lst.add_argument("--all", action="store_true", help="revoked keys too")
    revoke = sub.add_parser("revoke", help="a key stops working (within service.key_refresh_s)")
    revoke.add_argument("name")
    usage = sub.add_parser("usage", help="usage per key (and device) and day")
    usage.add_argument("name", nargs="?", help="one key's name (default: every key and device)")
    usage.add_argument("--days", type=int, default=7, help="days back from today (default 7)")
    usage.add_argument("--json", action="store_true", help="JSON lines instead of a table")


def _positive(value: float | None, what: str) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{what} must be above 0")


def account_from_args(args: argparse.Namespace) -> Account:
    check_key_name(args.name)
    for value, what in ((args.rps, "--rps"), (args.burst, "--burst"), (args.chars_per_minute, "--chars-per-minute"),
                        (args.streams, "--streams"), (args.quota_chars, "--quota-chars"),
                        (args.quota_audio_s, "--quota-audio-s")):  # fmt: skip
        _positive(value, what)
    if args.burst is not None and args.rps is None:
        raise ValueError("--burst needs --rps")
    limits = Limits(rps=args.rps, burst=args.burst, chars_per_minute=args.chars_per_minute, max_streams=args.streams,
                    quota_period=args.quota_period, quota_chars=args.quota_chars,
                    quota_audio_s=args.quota_audio_s)  # fmt: skip
    return Account(name=args.name, admin=args.admin, limits=limits, priority=args.priority,
                   voices=tuple(args.voice), add_voices=tuple(args.add_voice), cache=not args.no_cache)  # fmt: skip


async def _with_store(config_path: str | None, work: Callable[[Store], Awaitable[int]]) -> int:
    from gateway.services import STORE_SCHEMAS

    config = load_config(config_path)
    store = Store.from_config(config.store, STORE_SCHEMAS)
    try:
        await store.open()
        return await work(store)
    finally:
        await store.close()


async def _add(store: Store, args: argparse.Namespace) -> int:
    account = account_from_args(args)
    try:
        row, key = await KeyStore(store).add(account)
    except StoreConflict as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(key)
    print(f"key {row.account.name!r} added ({'admin, ' if account.admin else ''}{account.limits.describe()}); "
          "it is shown only this once", file=sys.stderr)  # fmt: skip
    return 0


async def _list(store: Store, args: argparse.Namespace) -> int:
    rows = await KeyStore(store).list(revoked=args.all)
    if not rows:
        print("no keys in the store (config keys: api.api_keys)", file=sys.stderr)
    for row in rows:
        a = row.account
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(row.created_at))
        state = "revoked " + time.strftime("%Y-%m-%d %H:%M", time.gmtime(row.revoked_at)) if row.revoked_at else "active"
        extras = [f"priority {a.priority}"] + (["admin"] if a.admin else []) + ([] if a.cache else ["no cache"])
        if a.voices:
            extras.append("voices " + ",".join(a.voices))
        print(f"{a.name}\t{state}\tcreated {created}\t{a.limits.describe()}\t{'; '.join(extras)}")
    return 0


async def _revoke(store: Store, args: argparse.Namespace) -> int:
    if await KeyStore(store).revoke(args.name):
        print(f"key {args.name!r} revoked", file=sys.stderr)
        return 0
    print(f"error: no active key named {args.name!r}", file=sys.stderr)
    return 1


async def _usage(store: Store, args: argparse.Namespace) -> int:
    if not 1 <= args.days <= 366:
        raise ValueError("--days must be within 1..366")
    meter = UsageMeter(store)
    rows = await meter.report([key_subject(args.name)] if args.name else None, days=args.days)
    if args.json:
        for row in rows:
            print(json.dumps(row.as_dict(), ensure_ascii=False))
        return 0
    print("day\tsubject\trequests\terrors\tcharacters\taudio_s\tfirst_byte_p50_ms\tp95_ms")
    for row in rows:
        d = row.as_dict()
        fb = d["first_byte_ms"]
        print(f"{row.day}\t{row.subject}\t{row.requests}\t{row.errors}\t{row.characters}\t{row.audio_s:.1f}\t"
              f"{fb['p50'] if fb['p50'] is not None else '-'}\t{fb['p95'] if fb['p95'] is not None else '-'}")
    return 0


def run(args: argparse.Namespace) -> int:
    commands = {"add": _add, "list": _list, "revoke": _revoke, "usage": _usage}
    command = commands[args.keys_command]
    try:
        if args.keys_command == "add":
            account_from_args(args)  # bad arguments before the store is opened
        return asyncio.run(_with_store(args.config, lambda store: command(store, args)))
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(f"error: the store is unavailable: {exc}", file=sys.stderr)
        return 3
    except StoreError as exc:
        print(f"error: the store failed: {exc}", file=sys.stderr)
        return 3
