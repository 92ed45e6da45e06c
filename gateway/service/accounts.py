"""API keys as accounts: who is calling, with which limits; config keys and keys kept in the store.

An ``Account`` is what a request's key stands for: a name (the label of its usage and metrics), an admin
role or not, its ``Limits`` (requests per second with a burst, characters per minute, concurrent streams,
a daily or monthly quota of characters or audio seconds), the engine priority class of its streams, the
voices it may use and add, and whether the audio cache serves it.

Keys come from two places:

- ``api.api_keys`` in config (as before the store): each is an admin account with no limits (full access),
  named ``config-<first 8 hex digits of its SHA-256>`` so its usage has a stable, non-secret name.
- The store (``keys_accounts``), managed with ``python -m gateway keys add|list|revoke|usage``
  (gateway/keys_cli.py): the key is printed once and only its SHA-256 is kept. Keys are 256 random bits,
  so a plain hash is enough (no salt or slow hash: nothing to brute-force).

``Accounts.authenticate`` looks a key up: config keys are compared in constant time with every configured
key; a stored key is found by its hash and remembered for ``service.key_refresh_s`` (so a busy key costs
no store call per request, and a revoked key stops within that time); keys not found are remembered too
(a flood of bad keys costs no store calls). While the store is down, keys seen before keep working and
an unseen key gets ``StoreUnavailable`` (the API answers 503).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from sqlalchemy import Boolean, Column, Float, String, Table, Text, func, insert, select, update

from gateway.store import STORE_METADATA, Schema, Store, StoreConflict, StoreUnavailable

__all__ = [
    "ANONYMOUS", "KEYS_SCHEMA", "Account", "Accounts", "KeyStore", "Limits", "StoredKey", "check_key_name",
    "hash_key", "new_key",
]  # fmt: skip

log = logging.getLogger(__name__)

keys_accounts = Table(
    "keys_accounts",
    STORE_METADATA,
    Column("id", String(24), primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("hash", String(64), nullable=False, unique=True),  # SHA-256 of the key, hex
    Column("admin", Boolean, nullable=False, default=False),
    Column("settings", Text, nullable=False),  # JSON: limits, priority, voices, cache
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=True),
)
KEYS_SCHEMA = Schema("keys", (keys_accounts,), version=1)

NAME_RE = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
KEY_PREFIX = "sk-xz-"
QuotaPeriod = Literal["day", "month"]
PriorityClass = Literal["interactive", "batch"]


@dataclass(frozen=True, slots=True)
class Limits:
    """An account's limits; None: no limit of that kind."""

    rps: float | None = None  # requests per second, refilled continuously
    burst: int | None = None  # requests at once (default: max(1, rps))
    chars_per_minute: int | None = None  # characters of text per minute (a bucket of that size)
    max_streams: int | None = None  # speech requests in flight at once
    quota_period: QuotaPeriod = "day"  # calendar day or month, UTC
    quota_chars: int | None = None  # characters per period
    quota_audio_s: float | None = None  # seconds of audio per period

    @property
    def request_burst(self) -> int | None:
        if self.rps is None:
            return None
        return self.burst if self.burst is not None else max(1, round(self.rps))

    @property
    def unlimited(self) -> bool:
        return all(
            v is None
            for v in (self.rps, self.chars_per_minute, self.max_streams, self.quota_chars, self.quota_audio_s)
        )

    def describe(self) -> str:
        parts = []
        if self.rps is not None:
            parts.append(f"{self.rps:g} req/s (burst {self.request_burst})")
        if self.chars_per_minute is not None:
            parts.append(f"{self.chars_per_minute} chars/min")
        if self.max_streams is not None:
            parts.append(f"{self.max_streams} streams")
        if self.quota_chars is not None:
            parts.append(f"{self.quota_chars} chars/{self.quota_period}")
        if self.quota_audio_s is not None:
            parts.append(f"{self.quota_audio_s:g} audio s/{self.quota_period}")
        return ", ".join(parts) or "no limits"


@dataclass(frozen=True, slots=True)
class Account:
    """What a key stands for (see the module docstring)."""

    name: str
    admin: bool = False
    limits: Limits = field(default_factory=Limits)
    priority: PriorityClass = "interactive"  # the engine class of its API streams
    voices: tuple[str, ...] = ()  # voices it may use; empty: every voice
    add_voices: tuple[str, ...] = ()  # names it may add, replace or remove; "*": any
    cache: bool = True  # the audio cache serves (and stores) its requests
    source: Literal["config", "store", "open"] = "store"

    def may_use_voice(self, voice: str) -> bool:
        return self.admin or not self.voices or voice in self.voices or self.may_add_voice(voice)

    def may_add_voice(self, voice: str) -> bool:
        return self.admin or "*" in self.add_voices or voice in self.add_voices

    def settings(self) -> dict[str, Any]:
        """What the store keeps of it besides name and role (JSON)."""
        return {
            "limits": {k: v for k, v in asdict(self.limits).items() if v is not None},
            "priority": self.priority,
            "voices": list(self.voices),
            "add_voices": list(self.add_voices),
            "cache": self.cache,
        }

    @classmethod
    def from_settings(cls, name: str, admin: bool, settings: dict[str, Any]) -> Account:
        limits = settings.get("limits") or {}
        return cls(
            name=name,
            admin=admin,
            limits=Limits(**{k: v for k, v in limits.items() if k in Limits.__slots__}),
            priority=settings.get("priority", "interactive"),
            voices=tuple(settings.get("voices") or ()),
            add_voices=tuple(settings.get("add_voices") or ()),
            cache=bool(settings.get("cache", True)),
        )


# No key needed (none configured or stored): today's full access, as before keys existed.
ANONYMOUS = Account(name="anonymous", admin=True, source="open")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_key() -> str:
    """A fresh key: 256 random bits."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


_KEY_SHAPE = re.compile(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_-]{43}")


def is_key_shaped(key: str) -> bool:
    """Whether ``key`` looks like one ``new_key()`` makes."""
    return _KEY_SHAPE.fullmatch(key) is not None


def check_key_name(name: str) -> str:
    if NAME_RE.fullmatch(name) is None:
        raise ValueError(f"a key's name must match [A-Za-z0-9_.@-]{{1,64}}, got {name!r}")
    return name


def config_account_name(key: str) -> str:
    return f"config-{hash_key(key)[:8]}"


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A row of ``keys_accounts`` as ``keys list`` shows it (never the key itself)."""

    id: str
    account: Account
    created_at: float
    revoked_at: float | None


class KeyStore:
    """The keys in the store: add, list, revoke, find by hash."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def add(self, account: Account) -> tuple[StoredKey, str]:
        """Stores a new key for ``account``; returns it and the key (shown once, never stored).
        ``StoreConflict`` when the name is taken (also by a revoked key)."""
        check_key_name(account.name)
        key = new_key()
        row = StoredKey(id=secrets.token_hex(8), account=replace(account, source="store"),
                        created_at=time.time(), revoked_at=None)  # fmt: skip
        async with self.store.write() as conn:
            taken = (await conn.execute(select(keys_accounts.c.id).where(keys_accounts.c.name == account.name))).first()
            if taken is not None:
                raise StoreConflict(f"a key named {account.name!r} exists already (revoked keys keep their name)")
            await conn.execute(
                insert(keys_accounts).values(
                    id=row.id, name=account.name, hash=hash_key(key), admin=account.admin,
                    settings=json.dumps(account.settings()), created_at=row.created_at, revoked_at=None,
                )
            )  # fmt: skip
        return row, key

    async def list(self, *, revoked: bool = True) -> list[StoredKey]:
        query = select(keys_accounts).order_by(keys_accounts.c.created_at)
        if not revoked:
            query = query.where(keys_accounts.c.revoked_at.is_(None))
        async with self.store.read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_stored(row) for row in rows]

    async def revoke(self, name: str) -> bool:
        """True when an active key of that name was revoked now."""
        async with self.store.write() as conn:
            result = await conn.execute(
                update(keys_accounts)
                .where(keys_accounts.c.name == name, keys_accounts.c.revoked_at.is_(None))
                .values(revoked_at=time.time())
            )
        return bool(result.rowcount)

    async def find(self, digest: str) -> Account | None:
        """The active account whose key hashes to ``digest``."""
        query = select(keys_accounts).where(keys_accounts.c.hash == digest, keys_accounts.c.revoked_at.is_(None))
        async with self.store.read() as conn:
            row = (await conn.execute(query)).mappings().first()
        return None if row is None else _stored(row).account

    async def count(self) -> int:
        """Keys ever added, revoked ones included (revoking the last key does not open the gateway)."""
        query = select(func.count()).select_from(keys_accounts)
        async with self.store.read() as conn:
            return int((await conn.execute(query)).scalar_one())


def _stored(row: Any) -> StoredKey:
    account = Account.from_settings(row["name"], bool(row["admin"]), json.loads(row["settings"]))
    return StoredKey(id=row["id"], account=account, created_at=row["created_at"], revoked_at=row["revoked_at"])


class Accounts:
    """Key -> account for every request (module docstring)."""

    def __init__(
        self,
        api_keys: Sequence[str],
        *,
        store: Store | None = None,
        require_keys: Literal["auto", "always"] = "auto",
        refresh_s: float = 5.0,
        cache_size: int = 10_000,
    ) -> None:
        self._config_keys = [(key.encode("utf-8", "surrogatepass"), config_account_name(key)) for key in api_keys]
        self.config_names = [name for _, name in self._config_keys]
        self.keys = KeyStore(store) if store is not None else None
        self.require_keys = require_keys
        self.refresh_s = refresh_s
        self.cache_size = cache_size
        self._found: OrderedDict[str, tuple[Account | None, float]] = OrderedDict()
        self._stored_keys: bool | None = None  # whether the store holds a key, revoked or not (None: not known yet)
        self._stored_keys_at = 0.0
        self._count_lock = asyncio.Lock()

    async def keys_required(self) -> bool:
        """Whether a request needs a key: ``service.require_keys: always``, a configured key, or a key in
        the store, revoked ones included (checked again every ``refresh_s``; while the store is down the
        last answer holds)."""
        if self.require_keys == "always" or self._config_keys:
            return True
        if self.keys is None:
            return False
        if self._stored_keys is None or time.monotonic() - self._stored_keys_at >= self.refresh_s:
            await self.refresh()
        return bool(self._stored_keys)

    async def refresh(self) -> None:
        """Looks again whether the store holds keys (one look at a time; the store's bound applies)."""
        if self.keys is None:
            return
        async with self._count_lock:
            if self._stored_keys is not None and time.monotonic() - self._stored_keys_at < self.refresh_s:
                return
            try:
                self._stored_keys = await self.keys.count() > 0
            except StoreUnavailable as exc:
                if self._stored_keys is None:
                    log.warning("API keys in the store not known yet (%s): only api.api_keys are checked", exc)
            self._stored_keys_at = time.monotonic()

    async def authenticate(self, key: str) -> Account | None:
        """The account of ``key``; None when it is no key of ours. ``StoreUnavailable`` when only the store
        could tell and it is down."""
        candidate = key.encode("utf-8", "surrogatepass")
        # every configured key is compared (no early exit): timing does not tell which one is closest
        matches = [name for k, name in self._config_keys if hmac.compare_digest(candidate, k)]
        if matches:
            return Account(name=matches[0], admin=True, source="config")
        if self.keys is None or not is_key_shaped(key):
            return None  # not one of ours: no store call (a flood of made-up keys costs nothing)
        digest = hash_key(key)
        now = time.monotonic()
        seen = self._found.get(digest)
        if seen is not None and now - seen[1] < self.refresh_s:
            self._found.move_to_end(digest)
            return seen[0]
        try:
            account = await self.keys.find(digest)
        except StoreUnavailable:
            if seen is not None:  # the store is down: what it said last time holds
                return seen[0]
            raise
        self._found[digest] = (account, time.monotonic())
        self._found.move_to_end(digest)
        while len(self._found) > self.cache_size:
            self._found.popitem(last=False)
        if account is not None:
            self._stored_keys = True
        return account

    def forget(self) -> None:
        """Drops every remembered lookup (the CLI changed keys in this process, tests)."""
        self._found.clear()
        self._stored_keys = None
