"""A store transaction that a cancelled caller cannot leave half done (``Store.read`` / ``Store.write``).

Why: SQLAlchemy's asyncio layer, cancelled in the middle of a statement or of BEGIN, invalidates the
connection and closes it in the background; with aiosqlite the SQLite connection can stay open for a
second and more meanwhile, still holding ``BEGIN IMMEDIATE``'s write lock, and every other writer of the
gateway waits for it (a probe: a third of 300 cancels at random moments inside three short writes held
the lock 0.9-1.5 s with a 0.3 s store bound). Worse, a writer that gave up at the store's bound while
SQLite still waited for that lock took the lock just after and kept it the same way, so the outage fed
itself (a CI run: claims, lease renewals, usage and outcomes all "no answer within 5 s").

So every database operation of a transaction (its BEGIN, each statement, its COMMIT or ROLLBACK and the
connection's return to the pool) runs in a task of its own that the caller awaits through
``asyncio.shield``. A cancelled caller (its task cancelled, or the store's own ``asyncio.timeout``)
leaves at once with its ``CancelledError``; the operation under way finishes, and a task of the store's
(kept in ``reapers``) then rolls the transaction back and gives the connection back, within the
transaction's bound. Statements are the same ``AsyncConnection.execute`` / ``run_sync`` calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncTransaction

log = logging.getLogger(__name__)
T = TypeVar("T")


class GuardedTransaction:
    """``async with GuardedTransaction(engine, reapers, bound_s) as conn``: one transaction, committed
    when the block ends, rolled back when it raises; ``conn.execute`` / ``conn.run_sync`` as on an
    ``AsyncConnection`` (and its ``dialect``). ``bound_s`` bounds the clean-up a cancelled caller leaves behind."""

    def __init__(self, engine: AsyncEngine, reapers: set[asyncio.Task[None]], bound_s: float) -> None:
        self._conn: AsyncConnection = engine.connect()
        self._reapers = reapers
        self._bound_s = bound_s
        self._trans: AsyncTransaction | None = None
        self._pending: asyncio.Future[Any] | None = None  # the operation under way (or the last one)
        self._gone = False  # the caller left (cancelled) before the transaction ended

    async def __aenter__(self) -> GuardedTransaction:
        try:
            await self._step(self._begin())
        except BaseException as exc:  # noqa: BLE001 - cancelled or failed: the connection goes back
            await self._end(commit=False, cancelled=isinstance(exc, asyncio.CancelledError))
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        cancelled = exc_type is not None and issubclass(exc_type, asyncio.CancelledError)
        await self._end(commit=exc_type is None, cancelled=cancelled)

    @property
    def dialect(self) -> Dialect:
        return self._conn.dialect

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        return await self._step(self._conn.execute(*args, **kwargs))

    async def run_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._step(self._conn.run_sync(fn, *args, **kwargs))

    async def _begin(self) -> AsyncTransaction:
        await self._conn.start()
        self._trans = await self._conn.begin()  # set here: a cancelled caller's _finish still sees it
        return self._trans

    async def _step(self, operation: Coroutine[Any, Any, T]) -> T:
        if self._pending is not None and not self._pending.done():
            operation.close()
            raise RuntimeError("a store transaction's statements run one at a time")
        task = asyncio.ensure_future(operation)
        self._pending = task
        return await asyncio.shield(task)  # a cancel leaves the operation to finish (then _end)

    async def _end(self, *, commit: bool, cancelled: bool) -> None:
        """Commit (or roll back) and give the connection back; after a cancel, in the background."""
        end = asyncio.ensure_future(self._finish(commit))
        self._reapers.add(end)  # the store keeps it until it is done (and waits for it when closing)
        end.add_done_callback(self._reaped)
        if cancelled:  # the caller leaves now
            self._gone = True
            return
        try:
            await asyncio.shield(end)
        except asyncio.CancelledError:
            self._gone = True
            raise

    async def _finish(self, commit: bool) -> None:
        pending = self._pending
        try:
            async with asyncio.timeout(self._bound_s):
                if pending is not None:
                    await asyncio.wait([pending])  # the BEGIN or statement a cancelled caller left
                if self._trans is not None and self._trans.is_active:
                    await (self._trans.commit() if commit else self._trans.rollback())
        except TimeoutError:  # the database is stuck past the bound: SQLAlchemy drops the connection
            if pending is not None and not pending.done():
                pending.cancel()
                await asyncio.wait([pending], timeout=self._bound_s)
            raise
        finally:
            if self._conn.sync_connection is not None:  # it connected (a refused connect has nothing to close)
                async with asyncio.timeout(self._bound_s):
                    await self._conn.close()  # back to the pool, reset (rolled back) there if still open

    def _reaped(self, task: asyncio.Task[None]) -> None:
        self._reapers.discard(task)
        if self._gone and not task.cancelled() and task.exception() is not None:
            log.warning("store: a cancelled transaction's clean-up failed: %r", task.exception())
