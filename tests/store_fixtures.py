"""Fixtures for the store's two engines (loaded by tests/conftest.py).

``postgres``: one real PostgreSQL server for the session (tests/postgres_server.py), started on first use.
``postgres_url``: a fresh database on it for one test. ``own_postgres``: a server of the test's own, which
it may stop, restart or freeze. ``store_url``: parametrized over both engines (SQLite file, PostgreSQL
database); ``store``: a ``Store`` opened on it with a test schema registered by the test module's
``STORE_TEST_SCHEMAS`` (none by default), closed afterwards.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.postgres_server import PostgresServer, make_template, postgres_bin_dir, postgres_server

ENGINES = ["sqlite", "postgresql"]
_names = itertools.count()


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[Path]:
    import shutil

    template = make_template(postgres_bin_dir())
    yield template
    shutil.rmtree(template.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres(postgres_template: Path) -> Iterator[PostgresServer]:
    with postgres_server(postgres_bin_dir(), postgres_template) as server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    return postgres.create_database(f"t{next(_names)}")


@pytest.fixture
def own_postgres(postgres_template: Path) -> Iterator[PostgresServer]:
    with postgres_server(postgres_bin_dir(), postgres_template) as server:
        yield server


@pytest.fixture(params=ENGINES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
async def store(store_url: str, request: pytest.FixtureRequest) -> AsyncIterator:
    from gateway.store import Store

    schemas = getattr(request.module, "STORE_TEST_SCHEMAS", ())
    opened = Store(store_url, schemas=schemas, timeout_s=5, connect_timeout_s=5)
    await opened.open()
    yield opened
    await opened.close()
