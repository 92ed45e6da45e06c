"""Per-device conversation memory on disk: one SQLite file (stdlib ``sqlite3``, WAL mode).

Each device has its exchanges (user, assistant), oldest first, and at most one summary of the
exchanges that were folded away. Every method is blocking and meant to run in a worker thread
(``asyncio.to_thread``); one connection is shared under a lock, so calls from several threads are
serialised.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DeviceMemory", "MemoryStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    device_id TEXT NOT NULL,
    user_text TEXT NOT NULL,
    assistant_text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS turns_by_device ON turns (device_id, id);
CREATE TABLE IF NOT EXISTS summaries (
    device_id TEXT PRIMARY KEY,
    summary TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class DeviceMemory:
    """What is remembered of one device: a summary of older talk and the recent exchanges."""

    summary: str = ""
    turns: tuple[tuple[str, str], ...] = ()
    last_id: int = 0  # the id of the newest stored exchange (0: none)

    @property
    def empty(self) -> bool:
        return not self.summary and not self.turns


class MemoryStore:
    """The SQLite file behind the memory; blocking calls (run them with ``asyncio.to_thread``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # autocommit off by default; `with self._db` commits or rolls back each call's transaction
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10.0)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)

    def load(self, device_id: str) -> DeviceMemory:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, user_text, assistant_text FROM turns WHERE device_id = ? ORDER BY id",
                (device_id,),
            ).fetchall()
            summary = self._db.execute(
                "SELECT summary FROM summaries WHERE device_id = ?", (device_id,)
            ).fetchone()
        return DeviceMemory(
            summary=summary[0] if summary else "",
            turns=tuple((user, assistant) for _, user, assistant in rows),
            last_id=rows[-1][0] if rows else 0,
        )

    def append(self, device_id: str, user_text: str, assistant_text: str) -> int:
        """Stores one exchange; returns how many exchanges the device now has."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO turns (device_id, user_text, assistant_text) VALUES (?, ?, ?)",
                (device_id, user_text, assistant_text),
            )
            (count,) = self._db.execute(
                "SELECT COUNT(*) FROM turns WHERE device_id = ?", (device_id,)
            ).fetchone()
        return int(count)

    def oldest(self, device_id: str, count: int) -> tuple[DeviceMemory, int]:
        """The summary and the ``count`` oldest exchanges, with the id of the last one (0: none)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, user_text, assistant_text FROM turns WHERE device_id = ? ORDER BY id LIMIT ?",
                (device_id, count),
            ).fetchall()
            summary = self._db.execute(
                "SELECT summary FROM summaries WHERE device_id = ?", (device_id,)
            ).fetchone()
        memory = DeviceMemory(summary=summary[0] if summary else "", turns=tuple((u, a) for _, u, a in rows))
        return memory, (rows[-1][0] if rows else 0)

    def fold(self, device_id: str, up_to_id: int, summary: str | None) -> bool:
        """Drops the exchanges up to ``up_to_id``; with a ``summary``, it replaces the old one.

        One transaction. Returns False (and writes nothing) when those exchanges are gone already
        (the device's memory was deleted meanwhile), so a late summary never brings it back.
        """
        with self._lock, self._db:
            deleted = self._db.execute(
                "DELETE FROM turns WHERE device_id = ? AND id <= ?", (device_id, up_to_id)
            ).rowcount
            if deleted == 0:
                return False
            if summary is not None:
                self._db.execute(
                    "INSERT INTO summaries (device_id, summary) VALUES (?, ?) "
                    "ON CONFLICT (device_id) DO UPDATE SET summary = excluded.summary",
                    (device_id, summary),
                )
        return True

    def count(self, device_id: str) -> int:
        with self._lock:
            (count,) = self._db.execute(
                "SELECT COUNT(*) FROM turns WHERE device_id = ?", (device_id,)
            ).fetchone()
        return int(count)

    def delete(self, device_id: str) -> bool:
        """Forgets the device; False when nothing was stored for it."""
        with self._lock, self._db:
            turns = self._db.execute("DELETE FROM turns WHERE device_id = ?", (device_id,)).rowcount
            summaries = self._db.execute("DELETE FROM summaries WHERE device_id = ?", (device_id,)).rowcount
        return bool(turns or summaries)

    def close(self) -> None:
        with self._lock:
            self._db.close()
