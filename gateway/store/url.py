"""``store.url`` into the URL the engine is made from: SQLite through aiosqlite, PostgreSQL through asyncpg.

Accepted: ``sqlite:///relative/file.db`` (relative to the project root, where config.yaml is),
``sqlite:////absolute/file.db``, ``postgresql://user:password@host:port/database`` (``postgres://`` too;
the password may be left out and given as ``PGPASSWORD``, which asyncpg reads; a unix socket as
``postgresql://user@/database?host=/run/postgresql``). An explicit driver must be the one we use
(``sqlite+aiosqlite``, ``postgresql+asyncpg``). An in-memory SQLite database is refused: it would lose
everything at exit. ``redact`` is the only form a URL is ever logged or reported in.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

__all__ = ["redact", "sqlite_path", "store_url"]

_DRIVERS = {"sqlite": ("aiosqlite", {"", "aiosqlite"}), "postgresql": ("asyncpg", {"", "asyncpg"})}


def store_url(raw: str, root: Path) -> URL:
    """The engine URL for ``raw``; ValueError (never quoting the password) when it is not one we serve."""
    try:
        url = make_url(raw.strip())
    except ArgumentError:
        raise ValueError("is not a database URL (sqlite:///FILE or postgresql://USER@HOST/DB)") from None
    backend, _, driver = url.drivername.partition("+")
    backend = "postgresql" if backend == "postgres" else backend
    if backend not in _DRIVERS:
        raise ValueError(f"{backend}:// is not supported: use sqlite:///FILE or postgresql://USER@HOST/DB")
    ours, accepted = _DRIVERS[backend]
    if driver not in accepted:
        raise ValueError(f"driver {backend}+{driver} is not supported: leave it out ({backend}://...)")
    url = url.set(drivername=f"{backend}+{ours}")
    if backend == "sqlite":
        database = url.database or ""
        if (
            database in ("", ":memory:")
            or database.startswith("file::memory:")
            or url.query.get("mode") == "memory"
        ):
            raise ValueError("an in-memory SQLite database loses everything at exit: give a file")
        if url.host or url.username or url.password:
            raise ValueError(
                "a SQLite URL has no host or user: sqlite:///relative/file or sqlite:////absolute/file"
            )
        path = Path(database).expanduser()
        url = url.set(database=str(path if path.is_absolute() else root / path))
    elif not url.database:
        raise ValueError("names no database: postgresql://USER@HOST:PORT/DATABASE")
    return url


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite store (None for PostgreSQL)."""
    return Path(url.database or "") if url.get_backend_name() == "sqlite" else None


def redact(url: URL) -> str:
    """The URL as it may be logged: the password replaced by ``***``."""
    return url.render_as_string(hide_password=True)
