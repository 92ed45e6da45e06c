"""The store (gateway/store) on both engines: SQLite files and a real PostgreSQL server (tests/postgres_server.py).

Transactions commit or roll back whole, upserts count exactly under concurrency, constraint violations
are ``StoreConflict``, schemas are created, upgraded and refused when newer, several stores migrating one
database at once do it once, and URLs are checked without ever quoting a password.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select, text

from gateway.config import ConfigError, load_config
from gateway.store import Schema, Store, StoreConflict, StoreError, add_column, create_tables, run_sql, upsert
from gateway.store.url import store_url
from tests.postgres_server import PASSWORD, PostgresServer

_md = MetaData()
items = Table(
    "demo_items",
    _md,
    Column("id", Integer, primary_key=True),
    Column("name", String(32), nullable=False, unique=True),
    Column("n", Integer, nullable=False),
)
usage = Table(  # the shape of issue 26's usage per key and day
    "demo_usage",
    _md,
    Column("key_id", String(32), primary_key=True),
    Column("day", String(10), primary_key=True),
    Column("requests", Integer, nullable=False),
)
DEMO = Schema("demo", (items, usage))
STORE_TEST_SCHEMAS = (DEMO,)  # the `store` fixture opens its store with these


async def _count(store: Store, table: Table) -> int:
    async with store.read() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def test_a_write_commits_whole_or_not_at_all(store: Store) -> None:
    async with store.write() as conn:
        await conn.execute(insert(items).values(name="a", n=1))
        await conn.execute(insert(items).values(name="b", n=2))
    with pytest.raises(RuntimeError, match="half way"):
        async with store.write() as conn:
            await conn.execute(insert(items).values(name="c", n=3))
            raise RuntimeError("half way")
    async with store.read() as conn:
        names = (await conn.execute(select(items.c.name).order_by(items.c.name))).scalars().all()
    assert names == ["a", "b"]
    assert store.status()["state"] == "ok"


async def test_a_unique_key_taken_is_a_conflict_and_nothing_of_it_is_written(store: Store) -> None:
    async with store.write() as conn:
        await conn.execute(insert(items).values(name="a", n=1))
    with pytest.raises(StoreConflict, match="refused the write"):
        async with store.write() as conn:
            await conn.execute(insert(items).values(name="b", n=2))
            await conn.execute(insert(items).values(name="a", n=3))
    assert await _count(store, items) == 1
    assert store.status()["state"] == "ok"  # a conflict is not an outage


async def test_concurrent_upserts_count_exactly(store: Store) -> None:
    """50 concurrent "one more request" upserts on one key and day, 10 on another: no lost update."""

    async def one_request(key: str) -> None:
        async with store.write() as conn:
            await conn.execute(
                upsert(conn.dialect.name, usage, {"key_id": key, "day": "2025-01-01", "requests": 1},
                       key=["key_id", "day"], set_=lambda new: {"requests": usage.c.requests + new.requests})
            )  # fmt: skip

    await asyncio.gather(*(one_request("k1") for _ in range(50)), *(one_request("k2") for _ in range(10)))
    async with store.read() as conn:
        rows = dict((await conn.execute(select(usage.c.key_id, usage.c.requests))).all())
    assert rows == {"k1": 50, "k2": 10}


async def test_upsert_replaces_or_keeps(store: Store) -> None:
    async with store.write() as conn:
        dialect = conn.dialect.name
        await conn.execute(upsert(dialect, items, {"id": 1, "name": "a", "n": 1}, key=["id"]))
        await conn.execute(upsert(dialect, items, {"id": 1, "name": "a2", "n": 2}, key=["id"]))  # replaces
        await conn.execute(
            upsert(dialect, items, {"id": 1, "name": "a3", "n": 3}, key=["id"], set_={})
        )  # keeps
    async with store.read() as conn:
        assert (await conn.execute(select(items.c.name, items.c.n))).all() == [("a2", 2)]


async def test_a_writer_cancelled_at_any_moment_leaves_no_lock_behind(store_url: str) -> None:
    """A caller cancelled inside a write (in its BEGIN, a statement or its COMMIT, at random moments)
    leaves no transaction open: the next write gets the write lock within a short bound. SQLAlchemy's own
    clean-up after such a cancel left SQLite's write lock held for a second and more (guarded.py)."""
    store = Store(store_url, schemas=(DEMO,), timeout_s=0.5, connect_timeout_s=5)
    await store.open()
    rng = random.Random(0)
    stuck: list[int] = []
    try:
        for trial in range(120):

            async def writer(trial: int = trial) -> None:
                for k in range(3):
                    async with store.write() as conn:
                        await conn.execute(insert(items).values(name=f"w{trial}-{k}", n=k))
                        await conn.execute(select(func.count()).select_from(items))

            task = asyncio.create_task(writer())
            await asyncio.sleep(rng.uniform(0, 0.004))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            try:
                async with store.write() as conn:
                    await conn.execute(insert(items).values(name=f"next{trial}", n=0))
            except StoreError:
                stuck.append(trial)
        assert stuck == [] and store.status()["state"] == "ok"
        assert await _count(store, items) >= 120  # every next write went in
    finally:
        await store.close()
    assert not store._reapers  # every cancelled transaction gave its connection back


async def test_a_reopened_store_keeps_its_data_and_migrates_nothing(store_url: str, caplog) -> None:
    first = Store(store_url, schemas=[DEMO])
    with caplog.at_level(logging.INFO, logger="gateway.store"):
        await first.open()
    assert "demo: created (version 1)" in caplog.text
    async with first.write() as conn:
        await conn.execute(insert(items).values(name="kept", n=1))
    await first.close()
    caplog.clear()
    second = Store(store_url, schemas=[DEMO])
    with caplog.at_level(logging.INFO, logger="gateway.store"):
        await second.open()
    assert "schema" not in caplog.text
    assert await _count(second, items) == 1
    await second.close()


async def test_a_schema_is_upgraded_in_steps_and_a_newer_one_is_refused(store_url: str) -> None:
    md1, md2 = MetaData(), MetaData()
    v1 = Schema("shop", (Table("shop_orders", md1, Column("id", Integer, primary_key=True)),))
    orders2 = Table(
        "shop_orders", md2, Column("id", Integer, primary_key=True), Column("note", String(40), nullable=True)
    )
    lines2 = Table("shop_lines", md2, Column("id", Integer, primary_key=True), Column("qty", Integer))
    steps = {
        2: add_column(orders2, "note"),
        3: create_tables(lines2),
        4: run_sql("UPDATE shop_orders SET note = 'old'"),
    }
    v4 = Schema("shop", (orders2, lines2), version=4, upgrades=steps)

    old = Store(store_url, schemas=[v1])
    await old.open()
    async with old.write() as conn:
        await conn.execute(text("INSERT INTO shop_orders (id) VALUES (7)"))
    await old.close()

    new = Store(store_url, schemas=[v4])
    await new.open()
    async with new.write() as conn:
        assert (await conn.execute(select(orders2.c.id, orders2.c.note))).all() == [(7, "old")]
        await conn.execute(insert(lines2).values(id=1, qty=2))
        version = await conn.execute(text("SELECT version FROM store_schema WHERE name = 'shop'"))
        assert version.scalar_one() == 4
    await new.close()

    older_gateway = Store(store_url, schemas=[v1])
    with pytest.raises(StoreError, match="shop schema is at version 4, newer than this gateway's 1"):
        await older_gateway.open()
    await older_gateway.close()


async def test_stores_migrating_one_database_at_once_do_it_once(store_url: str) -> None:
    """Six gateways start at once on one database; the migration step is slow, so they overlap."""
    md = MetaData()
    table = Table("race_rows", md, Column("id", Integer, primary_key=True))
    calls: list[int] = []

    def slow_step(conn) -> None:
        calls.append(1)
        conn.execute(text("SELECT pg_sleep(0.3)") if conn.dialect.name == "postgresql" else text("SELECT 1"))
        conn.execute(insert(table).values(id=len(calls)))

    v1 = Schema("race", (Table("race_rows", MetaData(), Column("id", Integer, primary_key=True)),))
    first = Store(store_url, schemas=[v1])
    await first.open()
    await first.close()
    v2 = Schema("race", (table,), version=2, upgrades={2: slow_step})
    stores = [Store(store_url, schemas=[v2], timeout_s=30) for _ in range(6)]
    await asyncio.gather(*(s.open() for s in stores))
    assert len(calls) == 1  # the others waited for the lock, then found version 2
    async with stores[0].read() as conn:
        assert (await conn.execute(select(table.c.id))).scalars().all() == [1]
    for s in stores:
        await s.close()


def test_schemas_are_checked_when_declared() -> None:
    md = MetaData()
    t = Table("pets_cats", md, Column("id", Integer, primary_key=True))
    with pytest.raises(ValueError, match="must be named pets2_"):
        Schema("pets2", (t,))
    with pytest.raises(ValueError, match="upgrade steps for versions 2..3"):
        Schema("pets", (t,), version=3, upgrades={2: run_sql("SELECT 1")})
    with pytest.raises(ValueError, match="lower case"):
        Schema("Pets", (t,))
    with pytest.raises(StoreError, match="registered twice"):
        Store("sqlite:////tmp/x.db", schemas=[Schema("pets", (t,)), Schema("pets", (t,))])
    other = Table("pets_cats", MetaData(), Column("id", Integer, primary_key=True))
    with pytest.raises(StoreError, match="pets_cats of schema pets_cats is already taken"):
        Store("sqlite:////tmp/x.db", schemas=[Schema("pets", (t,)), Schema("pets_cats", (other,))])


def test_urls_are_checked_and_relative_files_are_under_the_root(tmp_path: Path) -> None:
    assert store_url("sqlite:///data/gateway.db", tmp_path).database == str(tmp_path / "data" / "gateway.db")
    assert store_url("sqlite:////var/x.db", tmp_path).database == "/var/x.db"
    assert store_url("postgres://u:p@h/db", tmp_path).drivername == "postgresql+asyncpg"
    assert store_url("postgresql+asyncpg://u@h:5433/db", tmp_path).port == 5433
    for bad, why in [
        ("mysql://u:secret@h/db", "not supported"),
        ("postgresql+psycopg2://u:secret@h/db", "driver postgresql\\+psycopg2"),
        ("postgresql://u:secret@h", "names no database"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("not a url", "is not a database URL"),
    ]:
        with pytest.raises(ValueError, match=why) as err:
            store_url(bad, tmp_path)
        assert "secret" not in str(err.value)
    for bad in ("mysql://u:secret@h/db", "postgresql+psycopg2://u:secret@h/db", "sqlite:///:memory:"):
        with pytest.raises(ConfigError, match="store.url") as err:
            load_config(environ={"XZ_STORE__URL": bad})
        assert "secret" not in str(err.value)


async def test_sqlite_is_one_file_in_wal_mode(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/deep/folder/gateway.db", schemas=[DEMO])
    await store.open()
    async with store.read() as conn:
        assert (await conn.execute(text("PRAGMA journal_mode"))).scalar_one() == "wal"
    await store.close()
    assert (tmp_path / "deep" / "folder" / "gateway.db").is_file()


async def test_postgresql_reads_are_read_only(postgres_url: str) -> None:
    store = Store(postgres_url, schemas=[DEMO])
    await store.open()
    with pytest.raises(StoreError, match="read-only transaction"):
        async with store.read() as conn:
            await conn.execute(insert(items).values(name="x", n=1))
    await store.close()


async def test_the_password_is_never_in_logs_errors_or_status(
    own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(environ={}, overrides={"store": {"url": own_postgres.url()}})
    assert PASSWORD not in repr(config) and PASSWORD not in repr(config.store)
    seen: list[str] = []
    with caplog.at_level(logging.DEBUG):
        store = Store.from_config(config.store, [DEMO])
        await store.open()
        seen.append(str(store.status()))
        own_postgres.stop()
        with pytest.raises(StoreError) as down:
            async with store.read() as conn:
                await conn.execute(select(items))
        seen += [str(down.value), str(store.status())]
        await store.close()
        wrong_database = Store(
            own_postgres.url("no_such_db").replace("no_such_db", "missing"), schemas=[DEMO]
        )
        own_postgres.start()
        with pytest.raises(StoreError) as missing:
            await wrong_database.open()
        seen.append(str(missing.value))
        await wrong_database.close()
    seen.append(caplog.text)
    assert "xz_admin:***@" in seen[0]
    assert "unavailable" in seen[1] and "missing" in seen[-2]
    assert all(PASSWORD not in text_ for text_ in seen)


async def test_the_password_can_stay_out_of_the_url_as_pgpassword(
    postgres: PostgresServer, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What deploy/docker-compose.yml does: the URL without a password, PGPASSWORD in the environment."""
    database = postgres_url.rsplit("/", 1)[1]
    url = postgres.url(database, password=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent")  # no ~/.pgpass of the machine's either
    without = Store(url, schemas=[DEMO])
    with pytest.raises(StoreError, match="password"):
        await without.open()
    await without.close()
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    store = Store(url, schemas=[DEMO])
    await store.open()
    assert await _count(store, items) == 0
    await store.close()
