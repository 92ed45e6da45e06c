"""``Store``: the gateway's persistent data behind one small interface, on SQLAlchemy Core's asyncio.

SQLite by default (one file, WAL, through aiosqlite: zero set-up), PostgreSQL (through asyncpg) when
``store.url`` says ``postgresql://``, for several gateways that share devices. Feature modules use it as::

    async with store.write() as conn:            # one transaction, committed at the end
        await conn.execute(insert(memory_turns).values(...))
    async with store.read() as conn:              # read-only on PostgreSQL
        rows = (await conn.execute(select(...))).all()

Why async engines rather than sync ones in a thread pool: a call's bound is an ``asyncio.timeout`` that
cancels the wait itself, so a frozen database (the kernel still accepts and buffers, nothing answers)
costs the caller ``store.timeout_s`` and no thread stays stuck in a socket read; psycopg or sqlite3 in a
thread have no client-side read timeout, and a thread pool would be one more queue to size. aiosqlite
runs each SQLite connection in a thread of its own, which is what SQLite needs anyway.

Bounds. Every ``read``/``write`` block, from waiting for a pooled connection to the commit, runs within
``timeout_s``; PostgreSQL also gets it as ``statement_timeout``/``lock_timeout`` (the server stops a
runaway statement), asyncpg as ``command_timeout`` (the rollback after a cancelled block), a connect
within ``connect_timeout_s``, and ``idle_in_transaction_session_timeout`` so a gateway that vanishes
mid-transaction releases its locks. SQLite waits ``timeout_s`` for another writer's lock. A store that
is down raises ``StoreUnavailable`` within those bounds; it is logged once when it goes down and once when
it is back (``status()`` tells health checks, without I/O).

Transactions. A ``write()`` on SQLite begins ``BEGIN IMMEDIATE`` (it takes the write lock at once, so a
read-then-write block never fails half way on a busy database); pysqlite's own implicit transactions are
off and SQLAlchemy emits every BEGIN. A killed gateway leaves the last transaction uncommitted: SQLite's
WAL and PostgreSQL roll it back, committed ones stay.

Start-up. ``open()`` makes the engine and runs the schema migrations (gateway/store/schema.py) within
``migrate_timeout_s``. When the database is down then, ``open()`` raises ``StoreUnavailable`` and the
gateway starts all the same: the first call that finds it back runs the migrations (shared by concurrent
callers, each waiting within its own bound).

Secrets: the URL's password is never logged or reported (``safe_url``); statement parameters stay out of
error messages (``hide_parameters``), so a device's words never reach a log through a store error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import event, func, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from gateway.store.errors import StoreConflict, StoreError, StoreUnavailable
from gateway.store.guarded import GuardedTransaction
from gateway.store.schema import Schema, check_schemas, migrate
from gateway.store.url import redact, sqlite_path, store_url

if TYPE_CHECKING:
    from gateway.config import StoreConfig

__all__ = ["MIGRATION_LOCK_KEY", "Store"]

log = logging.getLogger(__name__)

# pg_advisory_xact_lock's key for schema migrations: any constant, the same in every gateway version
MIGRATION_LOCK_KEY = 0x78_69_61_6F_7A_68_69  # "xiaozhi"
POOL_RECYCLE_S = 1800  # PostgreSQL connections are renewed after this long (server and proxy limits)


def _project_root() -> Path:
    from gateway.config import DEFAULT_CONFIG_PATH

    return DEFAULT_CONFIG_PATH.parent


class Store:
    """One database for the gateway's data; see the module's docstring."""

    def __init__(
        self,
        url: str,
        *,
        schemas: Sequence[Schema] = (),
        root: Path | None = None,
        pool_size: int = 5,
        max_overflow: int = 5,
        connect_timeout_s: float = 5.0,
        timeout_s: float = 5.0,
        migrate_timeout_s: float = 120.0,
    ) -> None:
        try:
            self.url: URL = store_url(url, root or _project_root())
        except ValueError as exc:
            raise StoreError(f"store.url: {exc}") from None
        try:
            self.schemas = check_schemas(schemas)
        except ValueError as exc:
            raise StoreError(str(exc)) from None
        self.dialect = self.url.get_backend_name()  # "sqlite" or "postgresql"
        self.safe_url = redact(self.url)
        self.pool_size, self.max_overflow = pool_size, max_overflow
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.migrate_timeout_s = migrate_timeout_s
        self._engine: AsyncEngine | None = None
        self._reader: AsyncEngine | None = None
        self._writer: AsyncEngine | None = None
        self._migration: asyncio.Task[None] | None = None
        self._reapers: set[asyncio.Task[None]] = set()  # cancelled callers' transactions ending (guarded.py)
        self._schema_ready = False
        self._state = "closed"  # closed, starting, ok, unavailable
        self._error: str | None = None
        self._since = time.time()

    @classmethod
    def from_config(cls, cfg: StoreConfig, schemas: Sequence[Schema] = (), root: Path | None = None) -> Store:
        return cls(
            cfg.url,
            schemas=schemas,
            root=root,
            pool_size=cfg.pool_size,
            max_overflow=cfg.max_overflow,
            connect_timeout_s=cfg.connect_timeout_s,
            timeout_s=cfg.timeout_s,
            migrate_timeout_s=cfg.migrate_timeout_s,
        )

    @property
    def path(self) -> Path | None:
        """The SQLite file (None for PostgreSQL)."""
        return sqlite_path(self.url)

    # ---- life cycle --------------------------------------------------------------

    async def open(self) -> None:
        """Makes the engine and brings the schemas to their versions.

        StoreError: the SQLite folder cannot be made, or a schema is newer than this gateway (the caller
        stops). StoreUnavailable: the database is down now; calls retry the migrations when it is back.
        """
        if self._engine is not None:
            return
        path = self.path
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"store.url: cannot make the folder of {path}: {exc}") from None
        self._engine = self._make_engine()
        self._writer = self._engine.execution_options(store_write=True)
        self._reader = (
            self._engine.execution_options(postgresql_readonly=True)
            if self.dialect == "postgresql"
            else self._engine
        )
        self._state, self._since = "starting", time.time()
        await self._ensure_schema()  # bounded by migrate_timeout_s

    async def close(self) -> None:
        """Closes the pool's connections (bounded: a dead server does not hold shutdown)."""
        migration = self._migration
        if migration is not None:  # a retry of the migrations while the database was down
            migration.cancel()
            await asyncio.wait([migration], timeout=self.timeout_s)
        if self._reapers:  # cancelled callers' transactions still giving their connections back
            await asyncio.wait(list(self._reapers), timeout=self.timeout_s)
        engine, self._engine = self._engine, None
        self._state, self._since = "closed", time.time()
        if engine is not None:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await engine.dispose()
            except (TimeoutError, SQLAlchemyError, OSError) as exc:
                log.warning(
                    "store %s: closing its connections failed: %s", self.safe_url, exc or type(exc).__name__
                )

    def status(self) -> dict[str, Any]:
        """For health checks (no I/O): the engine, the URL without its password, the state since when."""
        return {
            "engine": self.dialect,
            "url": self.safe_url,
            "state": self._state,
            "since": self._since,
            "error": self._error,
            "schemas": {schema.name: schema.version for schema in self.schemas},
        }

    @property
    def available(self) -> bool:
        return self._state == "ok"

    # ---- transactions ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def read(self, *, timeout_s: float | None = None) -> AsyncIterator[AsyncConnection]:
        """One read transaction (read-only on PostgreSQL), bounded by ``timeout_s`` (default: the store's)."""
        async with self._transaction(write=False, timeout_s=timeout_s) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def write(self, *, timeout_s: float | None = None) -> AsyncIterator[AsyncConnection]:
        """One write transaction, committed when the block ends, rolled back when it raises.

        Bounded by ``timeout_s`` as a whole (default: the store's; longer for bulk work such as an
        import). Each statement stays bounded by the store's ``timeout_s`` on PostgreSQL: split bulk
        work into statements that each fit (``execute(insert(t), rows)`` in chunks)."""
        async with self._transaction(write=True, timeout_s=timeout_s) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _transaction(self, *, write: bool, timeout_s: float | None) -> AsyncIterator[AsyncConnection]:
        if self._engine is None:
            raise StoreUnavailable(f"the store ({self.safe_url}) is not open")
        engine = self._writer if write else self._reader
        assert engine is not None
        bound = self.timeout_s if timeout_s is None else timeout_s
        with self._errors(bound):
            async with asyncio.timeout(bound):
                await self._ensure_schema()
                async with GuardedTransaction(engine, self._reapers, bound) as conn:
                    yield cast(AsyncConnection, conn)  # execute / run_sync, safe to cancel (guarded.py)
        self._up()

    # ---- internals -----------------------------------------------------------------

    def _make_engine(self, bound_s: float | None = None) -> AsyncEngine:
        """The pooled engine (statements bounded by ``timeout_s``), or, with ``bound_s``, a one-connection
        engine for the migrations whose statements may take that long (PostgreSQL only)."""
        if self.dialect == "sqlite":
            engine = create_async_engine(
                self.url,
                connect_args={"timeout": self.timeout_s},  # how long SQLite waits for another writer's lock
                pool_size=self.pool_size,
                max_overflow=self.max_overflow,
                pool_timeout=self.timeout_s,
                hide_parameters=True,
            )
            event.listen(engine.sync_engine, "connect", _sqlite_connect)
            event.listen(engine.sync_engine, "begin", _sqlite_begin)
            return engine
        statement_s = bound_s or self.timeout_s
        connect_args = {
            "timeout": self.connect_timeout_s,
            "command_timeout": statement_s,  # also bounds the rollback after a cancelled block
            "server_settings": {
                "application_name": "xiaozhi-gateway",
                "statement_timeout": str(int(statement_s * 1000)),
                "lock_timeout": str(int(statement_s * 1000)),
                "idle_in_transaction_session_timeout": str(int(statement_s * 4000)),
            },
        }
        if bound_s is not None:
            return create_async_engine(
                self.url, connect_args=connect_args, poolclass=NullPool, hide_parameters=True
            )
        return create_async_engine(
            self.url,
            connect_args=connect_args,
            pool_size=self.pool_size,
            max_overflow=self.max_overflow,
            pool_timeout=self.timeout_s,
            pool_pre_ping=True,  # a pooled connection that died with a server restart is replaced, not failed
            pool_recycle=POOL_RECYCLE_S,
            hide_parameters=True,
        )

    async def _ensure_schema(self) -> None:
        """Runs the migrations once (one shared task; each caller waits within its own bound)."""
        if self._schema_ready:
            return
        if self._migration is None:
            self._migration = asyncio.create_task(self._migrate())
            self._migration.add_done_callback(self._migration_done)
        await asyncio.shield(self._migration)

    def _migration_done(self, task: asyncio.Task[None]) -> None:
        self._migration = None
        if not task.cancelled() and task.exception() is None:
            self._schema_ready = True

    async def _migrate(self) -> None:
        """The schema migrations in one transaction under the store's migration lock (module docstring)."""
        assert self._writer is not None
        engine = self._make_engine(self.migrate_timeout_s) if self.dialect == "postgresql" else self._writer
        try:
            with self._errors(self.migrate_timeout_s):
                async with asyncio.timeout(self.migrate_timeout_s):
                    async with engine.begin() as conn:
                        if self.dialect == "postgresql":
                            await conn.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
                        done = await conn.run_sync(migrate, self.schemas)
        finally:
            if engine is not self._writer:
                await engine.dispose()  # NullPool: nothing pooled, closes nothing that could hang
        for line in done:
            log.info("store %s: schema %s", self.safe_url, line)
        self._up()

    @contextlib.contextmanager
    def _errors(self, bound_s: float) -> Iterator[None]:
        """Driver errors and timeouts as StoreError kinds, messages without the password or parameters."""
        try:
            yield
        except StoreError:
            raise
        except TimeoutError:
            raise self._down(f"no answer within {bound_s:g} s") from None
        except IntegrityError as exc:
            raise StoreConflict(f"the store refused the write: {_reason(exc)}") from None
        except (OperationalError, InterfaceError) as exc:
            raise self._down(_reason(exc)) from None
        except DBAPIError as exc:
            if exc.connection_invalidated or _transient(exc):
                raise self._down(_reason(exc)) from None
            raise StoreError(f"the store ({self.dialect}) failed: {_reason(exc)}") from None
        except OSError as exc:  # a connect that failed below the driver's error mapping
            raise self._down(f"{type(exc).__name__}: {exc}") from None

    def _down(self, why: str) -> StoreUnavailable:
        if self._state != "unavailable":
            log.warning("store %s is unavailable: %s", self.safe_url, why)
            self._state, self._since = "unavailable", time.time()
        self._error = why
        return StoreUnavailable(f"the store ({self.safe_url}) is unavailable: {why}")

    def _up(self) -> None:
        if self._state == "unavailable":
            log.info("store %s is available again", self.safe_url)
        if self._state != "ok" and self._engine is not None:
            self._state, self._since, self._error = "ok", time.time(), None


# SQLSTATE classes of PostgreSQL errors that say "not now" rather than "wrong": connection exceptions,
# serialization failures and deadlocks, insufficient resources (too many connections, disk full),
# operator intervention (shutdown, starting up, statement_timeout), system errors; and lock_timeout.
_TRANSIENT_SQLSTATE_CLASSES = ("08", "40", "53", "57", "58")
_TRANSIENT_SQLSTATES = ("55P03",)


def _driver_error(exc: DBAPIError) -> BaseException:
    """The driver's own exception (SQLAlchemy's asyncpg adapter wraps asyncpg's in its DBAPI classes)."""
    orig: BaseException = exc.orig if exc.orig is not None else exc
    inner = orig.__cause__
    return inner if inner is not None and type(inner).__module__.startswith("asyncpg") else orig


def _transient(exc: DBAPIError) -> bool:
    sqlstate = getattr(_driver_error(exc), "sqlstate", None) or ""
    return sqlstate.startswith(_TRANSIENT_SQLSTATE_CLASSES) or sqlstate in _TRANSIENT_SQLSTATES


def _reason(exc: DBAPIError) -> str:
    """The driver's message and class (SQLAlchemy's own message would add the statement)."""
    error = _driver_error(exc)
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    """Each SQLite connection: SQLAlchemy emits BEGIN (pysqlite's own transactions off), WAL, FKs on."""
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(
            "PRAGMA synchronous=NORMAL"
        )  # durable at each checkpoint; a process kill loses nothing
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _sqlite_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("store_write") else "BEGIN")
