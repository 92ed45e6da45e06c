"""The store when things go wrong: a PostgreSQL server stopped or frozen mid-way, a gateway that starts while
it is down, and a process killed (kill -9) in the middle of a transaction, on both engines.

Bounds: a call on a frozen server ends with ``StoreUnavailable`` after ``timeout_s`` plus the time
SQLAlchemy gives a connection that stopped answering to close (2 s) before dropping it; the tests allow
that plus slack for a loaded 2-core machine. A refused connection (server stopped) fails at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select, update

from gateway.llm.memory_store import MEMORY_SCHEMA, memory_summaries, memory_turns
from gateway.store import Store, StoreUnavailable
from tests.postgres_server import PostgresServer
from tests.store_writer import BATCH_ROWS, STOP_AT, WRITER_SCHEMA, counter, rows

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 1.0  # the stores' call bound in these tests
CLOSE_S = 2.0  # SQLAlchemy's graceful close of a connection being dropped (asyncpg close(timeout=2))
SLACK_S = 2.0  # a loaded machine


async def _read_count(store: Store) -> int:
    async with store.read() as conn:
        return int((await conn.execute(select(func.count()).select_from(memory_turns))).scalar_one())


async def _timed_failure(store: Store) -> tuple[float, str]:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as err:
        await _read_count(store)
    return time.monotonic() - started, str(err.value)


async def test_a_stopped_server_fails_calls_at_once_and_a_restarted_one_serves_again(
    own_postgres: PostgresServer,
) -> None:
    store = Store(
        own_postgres.url(), schemas=[MEMORY_SCHEMA], timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S
    )
    await store.open()
    assert await _read_count(store) == 0
    own_postgres.stop()
    elapsed, message = await _timed_failure(store)
    assert elapsed < TIMEOUT_S + SLACK_S and "is unavailable" in message
    assert store.status()["state"] == "unavailable" and store.status()["error"]
    own_postgres.start()
    assert await _read_count(store) == 0  # the pool's dead connections were replaced, no restart needed
    assert store.status()["state"] == "ok" and store.status()["error"] is None
    await store.close()


async def test_a_frozen_server_costs_a_call_its_bound_not_a_hang(own_postgres: PostgresServer) -> None:
    store = Store(
        own_postgres.url(), schemas=[MEMORY_SCHEMA], timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S
    )
    await store.open()
    assert await _read_count(store) == 0
    own_postgres.freeze()
    try:
        for _ in range(2):  # a pooled connection, then a new one that cannot connect
            elapsed, message = await _timed_failure(store)
            assert elapsed < TIMEOUT_S + CLOSE_S + SLACK_S, elapsed
            assert "unavailable" in message
    finally:
        own_postgres.thaw()
    assert await _read_count(store) == 0
    started = time.monotonic()
    await store.close()
    assert time.monotonic() - started < TIMEOUT_S + SLACK_S


async def test_a_store_down_at_start_up_is_migrated_when_it_is_back(own_postgres: PostgresServer) -> None:
    own_postgres.stop()
    store = Store(
        own_postgres.url(), schemas=[MEMORY_SCHEMA], timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await store.open()
    assert time.monotonic() - started < TIMEOUT_S + SLACK_S
    own_postgres.start()
    assert await _read_count(store) == 0  # the first call ran the migrations: the table exists
    await store.close()


async def _hold_then_wait(store: Store) -> tuple[float, str]:
    """One write holds its transaction open (the row, SQLite's write lock, the only pooled connection);
    another write on the same row waits for it; how long until it gave up, and why."""
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with store.write(timeout_s=30) as conn:  # outlasts the other's wait
            await conn.execute(update(memory_summaries).values(summary="held"))
            holding.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    await holding.wait()
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable) as err:
            async with store.write() as conn:
                await conn.execute(update(memory_summaries).values(summary="waited"))
        return time.monotonic() - started, str(err.value)
    finally:
        release.set()
        await holder


@pytest.mark.parametrize("pool_size", [1, 5])
async def test_a_write_waiting_for_a_busy_store_gives_up_within_its_bound(
    store_url: str, pool_size: int
) -> None:
    """pool_size 1: the wait is for the pool's one connection; 5: for the row (PostgreSQL's lock_timeout)
    or SQLite's write lock (its busy timeout). Either way StoreUnavailable within the bound, and then
    the store works."""
    store = Store(
        store_url, schemas=[MEMORY_SCHEMA], timeout_s=TIMEOUT_S, pool_size=pool_size, max_overflow=0
    )
    await store.open()
    async with store.write() as conn:
        await conn.execute(insert(memory_summaries).values(device_id="dev", summary="first"))
    elapsed, message = await _hold_then_wait(store)
    assert TIMEOUT_S * 0.9 <= elapsed < TIMEOUT_S + SLACK_S, elapsed
    assert "unavailable" in message
    async with store.read() as conn:
        assert (await conn.execute(select(memory_summaries.c.summary))).scalar_one() == "held"
    await store.close()


def _writer(url: str, mode: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Runs tests/store_writer.py until it stops inside a transaction; returns it and what it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.store_writer", url, mode],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:  # bounded: the writer either reaches "mid" or exits (EOF)
        lines.append(line.strip())
        if line.startswith("mid"):
            break
    return proc, lines


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


async def test_a_kill_9_inside_a_transaction_leaves_every_batch_whole(store_url: str) -> None:
    proc, lines = await asyncio.to_thread(_writer, store_url, "batches")
    assert lines[-1] == f"mid {STOP_AT}", lines
    _kill(proc)
    store = Store(store_url, schemas=[MEMORY_SCHEMA, WRITER_SCHEMA], timeout_s=10)
    await store.open()
    async with store.write() as conn:  # the killed writer's lock is gone: this write does not wait
        per_batch = dict(
            (await conn.execute(select(rows.c.batch, func.count()).group_by(rows.c.batch))).all()
        )
        last = (await conn.execute(select(counter.c.last))).scalar_one()
    committed = [int(line.split()[1]) for line in lines if line.startswith("committed")]
    assert committed == list(range(STOP_AT))
    assert per_batch == {batch: BATCH_ROWS for batch in committed}  # the killed batch left nothing
    assert last == STOP_AT - 1
    await store.close()


async def test_a_kill_9_inside_a_memory_fold_keeps_the_exchanges(store_url: str) -> None:
    """The fold's DELETE of old exchanges ran, its summary was not written yet: both or neither."""
    proc, lines = await asyncio.to_thread(_writer, store_url, "fold")
    assert lines[-1] == "mid fold", lines
    _kill(proc)
    store = Store(store_url, schemas=[MEMORY_SCHEMA, WRITER_SCHEMA], timeout_s=10)
    await store.open()
    async with store.write() as conn:
        kept = (
            (await conn.execute(select(memory_turns.c.user_text).order_by(memory_turns.c.id))).scalars().all()
        )
        summaries = (await conn.execute(select(func.count()).select_from(memory_summaries))).scalar_one()
    assert kept == [f"question {i}" for i in range(10)] and summaries == 0
    await store.close()
