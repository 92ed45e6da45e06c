"""Per-device conversation memory in the gateway's store (gateway/store): its tables and queries.

Each device has its exchanges (user, assistant), oldest first, and at most one summary of the
exchanges that were folded away. Every method is one bounded store transaction and raises
``StoreError`` (``StoreUnavailable`` when the database is down); ``ConversationMemory``
(gateway/llm/memory.py) decides what a failure means for a device. With PostgreSQL, every gateway
sees every device's memory.

A memory file of the gateway before the store (``session.memory_path``, one SQLite file per gateway)
is imported once (``import_legacy_file``): its rows go into the store in one transaction, recorded by
the file's content digest so a second start (or a second gateway with a copy) does not import it twice,
and the file is then renamed ``<name>.imported``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.store import STORE_METADATA, Schema, Store, upsert

__all__ = ["MEMORY_SCHEMA", "DeviceMemory", "LegacyImport", "MemoryStore", "import_legacy_file"]

log = logging.getLogger(__name__)

DEVICE_ID_CHARS = 128  # as the device handshake caps a Device-Id
IMPORT_CHUNK_ROWS = 1000  # exchanges per INSERT when a legacy file is imported

memory_turns = Table(
    "memory_turns",
    STORE_METADATA,
    # ids only grow (SQLite AUTOINCREMENT): a fold "up to id N" never touches exchanges saved after it
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("device_id", String(DEVICE_ID_CHARS), nullable=False),
    Column("user_text", Text, nullable=False),
    Column("assistant_text", Text, nullable=False),
    Index("memory_turns_by_device", "device_id", "id"),
    sqlite_autoincrement=True,
)
memory_summaries = Table(
    "memory_summaries",
    STORE_METADATA,
    Column("device_id", String(DEVICE_ID_CHARS), primary_key=True),
    Column("summary", Text, nullable=False),
)
memory_imports = Table(  # legacy memory files already imported, by the digest of their rows
    "memory_imports",
    STORE_METADATA,
    Column("digest", String(64), primary_key=True),
    Column("source", Text, nullable=False),
    Column("imported_at", DateTime(timezone=True), nullable=False),
)

MEMORY_SCHEMA = Schema("memory", (memory_turns, memory_summaries, memory_imports), version=1)


@dataclass(frozen=True)
class DeviceMemory:
    """What is remembered of one device: a summary of older talk and the recent exchanges."""

    summary: str = ""
    turns: tuple[tuple[str, str], ...] = ()
    last_id: int = 0  # the id of the newest stored exchange (0: none)

    @property
    def empty(self) -> bool:
        return not self.summary and not self.turns


async def _summary(conn: AsyncConnection, device_id: str) -> str:
    found = await conn.execute(
        select(memory_summaries.c.summary).where(memory_summaries.c.device_id == device_id)
    )
    return found.scalar() or ""


async def _count(conn: AsyncConnection, device_id: str) -> int:
    found = await conn.execute(
        select(func.count()).select_from(memory_turns).where(memory_turns.c.device_id == device_id)
    )
    return int(found.scalar_one())


class MemoryStore:
    """The memory's queries on a ``Store``; each call one transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def load(self, device_id: str) -> DeviceMemory:
        memory, _ = await self.oldest(device_id, None)
        return memory

    async def oldest(self, device_id: str, count: int | None) -> tuple[DeviceMemory, int]:
        """The summary and the ``count`` oldest exchanges (None: all), with the last one's id (0: none)."""
        query = (
            select(memory_turns.c.id, memory_turns.c.user_text, memory_turns.c.assistant_text)
            .where(memory_turns.c.device_id == device_id)
            .order_by(memory_turns.c.id)
            .limit(count)
        )
        async with self.store.read() as conn:
            rows = (await conn.execute(query)).all()
            summary = await _summary(conn, device_id)
        last_id = int(rows[-1].id) if rows else 0
        memory = DeviceMemory(
            summary=summary, turns=tuple((r.user_text, r.assistant_text) for r in rows), last_id=last_id
        )
        return memory, last_id

    async def append(self, device_id: str, user_text: str, assistant_text: str) -> int:
        """Stores one exchange; returns how many exchanges the device now has."""
        async with self.store.write() as conn:
            await conn.execute(
                insert(memory_turns).values(
                    device_id=device_id, user_text=user_text, assistant_text=assistant_text
                )
            )
            return await _count(conn, device_id)

    async def fold(self, device_id: str, up_to_id: int, summary: str | None) -> bool:
        """Drops the exchanges up to ``up_to_id``; with a ``summary``, it replaces the old one.

        One transaction. Returns False (and writes nothing) when those exchanges are gone already
        (the device's memory was deleted meanwhile), so a late summary never brings it back.
        """
        async with self.store.write() as conn:
            deleted = await conn.execute(
                delete(memory_turns).where(
                    memory_turns.c.device_id == device_id, memory_turns.c.id <= up_to_id
                )
            )
            if deleted.rowcount == 0:
                return False
            if summary is not None:
                await conn.execute(
                    upsert(conn.dialect.name, memory_summaries, {"device_id": device_id, "summary": summary},
                           key=["device_id"])
                )  # fmt: skip
        return True

    async def count(self, device_id: str) -> int:
        async with self.store.read() as conn:
            return await _count(conn, device_id)

    async def delete(self, device_id: str) -> bool:
        """Forgets the device; False when nothing was stored for it."""
        async with self.store.write() as conn:
            turns = await conn.execute(delete(memory_turns).where(memory_turns.c.device_id == device_id))
            summaries = await conn.execute(
                delete(memory_summaries).where(memory_summaries.c.device_id == device_id)
            )
        return bool(turns.rowcount or summaries.rowcount)


# ---- the memory file of gateways before the store ------------------------------------------------


@dataclass(frozen=True)
class LegacyImport:
    """What ``import_legacy_file`` did: rows imported (0 and ``already``: imported before)."""

    turns: int = 0
    summaries: int = 0
    already: bool = False
    renamed_to: Path | None = None


@dataclass(frozen=True)
class _LegacyRows:
    turns: list[tuple[str, str, str]]
    summaries: list[tuple[str, str]]
    digest: str


def _read_legacy(path: Path) -> _LegacyRows:
    """The old file's rows, oldest first (sqlite3 directly: it is a plain SQLite file, read once)."""
    db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=10.0)  # rw: its WAL may need replaying
    try:
        turns = db.execute("SELECT device_id, user_text, assistant_text FROM turns ORDER BY id").fetchall()
        summaries = db.execute("SELECT device_id, summary FROM summaries ORDER BY device_id").fetchall()
    finally:
        db.close()
    digest = hashlib.sha256()
    for row in [*turns, ("--summaries--",), *summaries]:
        for value in row:
            digest.update(str(value).encode("utf-8") + b"\x00")
        digest.update(b"\x01")
    return _LegacyRows(turns=turns, summaries=summaries, digest=digest.hexdigest())


async def import_legacy_file(store: Store, path: Path) -> LegacyImport:
    """Imports the pre-store memory file at ``path`` once, then renames it ``<name>.imported``.

    Its exchanges are appended after what the store already holds for each device (they are older, but
    a device normally has nothing in a new store yet); its summaries go in where the store has none for
    the device. ``StoreError`` leaves the file as it is, to be imported at the next start.
    """
    try:
        rows = await asyncio.to_thread(_read_legacy, path)
    except sqlite3.Error as exc:
        log.warning(
            "memory file %s is not a memory file of an earlier gateway (%s): left as it is", path, exc
        )
        return LegacyImport()
    async with store.write(timeout_s=store.migrate_timeout_s) as conn:  # start-up work, like a migration
        seen = await conn.execute(
            select(memory_imports.c.digest).where(memory_imports.c.digest == rows.digest)
        )
        already = seen.first() is not None
        if not already:
            for start in range(0, len(rows.turns), IMPORT_CHUNK_ROWS):  # each statement within its bound
                chunk = rows.turns[start : start + IMPORT_CHUNK_ROWS]
                await conn.execute(
                    insert(memory_turns),
                    [{"device_id": d, "user_text": u, "assistant_text": a} for d, u, a in chunk],
                )
            for device_id, summary in rows.summaries:
                await conn.execute(
                    upsert(conn.dialect.name, memory_summaries, {"device_id": device_id, "summary": summary},
                           key=["device_id"], set_={})
                )  # fmt: skip
            await conn.execute(
                insert(memory_imports).values(
                    digest=rows.digest, source=str(path), imported_at=datetime.now(UTC)
                )
            )
    target = path.with_name(path.name + ".imported")
    renamed: Path | None = target
    try:
        await asyncio.to_thread(path.rename, target)  # the -wal/-shm files went when sqlite3 closed it
    except OSError as exc:
        log.warning("memory file %s imported but not renamed (%s); it will not be imported again", path, exc)
        renamed = None
    if already:
        log.info("memory file %s was imported before; renamed to %s", path, renamed)
        return LegacyImport(already=True, renamed_to=renamed)
    log.info(
        "memory file %s imported into the store: %d exchanges, %d summaries; renamed to %s",
        path, len(rows.turns), len(rows.summaries), renamed,
    )  # fmt: skip
    return LegacyImport(turns=len(rows.turns), summaries=len(rows.summaries), renamed_to=renamed)
