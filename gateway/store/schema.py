"""Versioned schemas: each feature module declares its tables and registers them as one ``Schema``.

The store keeps one row per schema in ``store_schema`` (name, version). At start-up (``Store.open``),
inside one transaction that holds the store's migration lock (PostgreSQL: a transaction-level advisory
lock; SQLite: ``BEGIN IMMEDIATE``, the database's write lock), each registered schema is brought to its
version: a schema with no row has its tables created as they are declared now and is stamped with its
current version (a new install runs no upgrade steps); a schema at an older version runs its upgrade
steps in order; a schema newer than this gateway stops the start with a clear error. Two gateways
starting at once against one PostgreSQL: the second waits for the lock, then finds nothing to do.

Why not Alembic: its revision scripts describe one application's history, and the tables here belong to
several feature modules that each evolve on their own; it would need branches per module plus our own
lock for concurrent start-ups anyway. A version per schema, steps as plain functions, ~100 lines.

How a feature module adds its tables (docs/store.md has the whole recipe)::

    # gateway/llm/memory_store.py
    memory_turns = Table("memory_turns", STORE_METADATA, Column(...), ...)
    MEMORY_SCHEMA = Schema("memory", (memory_turns, memory_summaries), version=1)
    # gateway/services.py: STORE_SCHEMAS = (MEMORY_SCHEMA, ...)

and later, to add a column, bump the version and give the step that upgrades existing databases::

    MEMORY_SCHEMA = Schema("memory", (...), version=2,
                           upgrades={2: add_column(memory_turns, "created_at")})
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import Column, Connection, DateTime, Integer, MetaData, String, Table, select, text, update
from sqlalchemy.schema import CreateColumn

from gateway.store.errors import StoreError

__all__ = [
    "SCHEMA_VERSIONS", "STORE_METADATA", "Schema", "Upgrade", "add_column", "create_tables", "migrate",
    "run_sql",
]  # fmt: skip

STORE_METADATA = (
    MetaData()
)  # the tables of every feature module: Table("<schema>_<name>", STORE_METADATA, ...)

SCHEMA_VERSIONS = Table(
    "store_schema",
    MetaData(),  # the store's own: never created by a feature's create_all
    Column("name", String(64), primary_key=True),
    Column("version", Integer, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

Upgrade = Callable[[Connection], None]  # one step, run inside the migration transaction (sync Core API)

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


@dataclass(frozen=True)
class Schema:
    """A feature's tables at ``version``; ``upgrades[v]`` turns a version ``v - 1`` database into ``v``.

    Table names start with the schema's name (``memory`` owns ``memory_turns``), so features never
    collide. Upgrade steps exist for every version from 2 to ``version``.
    """

    name: str
    tables: tuple[Table, ...]
    version: int = 1
    upgrades: Mapping[int, Upgrade] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"schema name {self.name!r}: lower case letters, digits, _ (at most 48)")
        if self.version < 1:
            raise ValueError(f"schema {self.name}: version must be >= 1")
        if not self.tables:
            raise ValueError(f"schema {self.name}: no tables")
        for table in self.tables:
            if table.name != self.name and not table.name.startswith(self.name + "_"):
                raise ValueError(f"schema {self.name}: table {table.name} must be named {self.name}_...")
        if sorted(self.upgrades) != list(range(2, self.version + 1)):
            raise ValueError(
                f"schema {self.name} version {self.version}: upgrade steps for versions 2..{self.version} "
                f"are needed, got {sorted(self.upgrades)}"
            )


def check_schemas(schemas: Sequence[Schema]) -> tuple[Schema, ...]:
    """The schemas as registered, or ValueError when two share a name or a table."""
    names: set[str] = set()
    tables: dict[str, str] = {}
    for schema in schemas:
        if schema.name in names:
            raise ValueError(f"schema {schema.name} is registered twice")
        names.add(schema.name)
        for table in schema.tables:
            if table.name in tables or table.name == SCHEMA_VERSIONS.name:
                raise ValueError(f"table {table.name} of schema {schema.name} is already taken")
            tables[table.name] = schema.name
    return tuple(schemas)


def create_tables(*tables: Table) -> Upgrade:
    """An upgrade step that creates ``tables`` (with their indexes) as declared."""

    def step(conn: Connection) -> None:
        for table in tables:
            table.create(conn)

    return step


def add_column(table: Table, name: str) -> Upgrade:
    """An upgrade step that adds the declared column ``name`` of ``table`` (nullable or with a default)."""

    def step(conn: Connection) -> None:
        column = CreateColumn(table.c[name]).compile(dialect=conn.dialect)
        conn.execute(
            text(f"ALTER TABLE {conn.dialect.identifier_preparer.format_table(table)} ADD COLUMN {column}")
        )

    return step


def run_sql(*statements: str) -> Upgrade:
    """An upgrade step of plain SQL statements (portable SQL, or check ``conn.dialect.name`` yourself)."""

    def step(conn: Connection) -> None:
        for statement in statements:
            conn.execute(text(statement))

    return step


def migrate(conn: Connection, schemas: Sequence[Schema]) -> list[str]:
    """Brings every schema to its version (in the caller's transaction, under its lock); what was done."""
    SCHEMA_VERSIONS.create(conn, checkfirst=True)
    current = {
        name: version
        for name, version in conn.execute(select(SCHEMA_VERSIONS.c.name, SCHEMA_VERSIONS.c.version))
    }
    done: list[str] = []
    now = datetime.now(UTC)
    for schema in schemas:
        have = current.get(schema.name)
        if have is None:
            for metadata in {id(t.metadata): t.metadata for t in schema.tables}.values():
                metadata.create_all(
                    conn, tables=[t for t in schema.tables if t.metadata is metadata], checkfirst=False
                )
            conn.execute(
                SCHEMA_VERSIONS.insert().values(name=schema.name, version=schema.version, updated_at=now)
            )
            done.append(f"{schema.name}: created (version {schema.version})")
        elif have > schema.version:
            raise StoreError(
                f"the store's {schema.name} schema is at version {have}, newer than this gateway's "
                f"{schema.version}: run the newer gateway (or restore a backup taken before the upgrade)"
            )
        elif have < schema.version:
            for version in range(have + 1, schema.version + 1):
                schema.upgrades[version](conn)
            conn.execute(
                update(SCHEMA_VERSIONS)
                .where(SCHEMA_VERSIONS.c.name == schema.name)
                .values(version=schema.version, updated_at=now)
            )
            done.append(f"{schema.name}: upgraded {have} -> {schema.version}")
    return done
