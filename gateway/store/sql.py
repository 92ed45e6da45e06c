"""Statements that differ between SQLite and PostgreSQL, written once for both."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.base import ReadOnlyColumnCollection
from sqlalchemy.sql.dml import Insert

__all__ = ["upsert"]

Excluded = ReadOnlyColumnCollection[str, Any]


def upsert(
    dialect: str,
    table: Table,
    values: Mapping[str, Any],
    key: Sequence[str],
    set_: Mapping[str, Any] | Callable[[Excluded], Mapping[str, Any]] | None = None,
) -> Insert:
    """INSERT ``values``, or on a conflict over the ``key`` columns UPDATE (``ON CONFLICT DO UPDATE``).

    ``set_`` by default copies every non-key value; a callable gets the would-be row (``excluded``) to
    combine old and new, e.g. a counter: ``lambda new: {"count": usage.c.count + new.count}``.
    ``dialect`` is ``conn.dialect.name`` of the connection that runs it.
    """
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table).values(**values)
    excluded = insert.excluded
    if set_ is None:
        updates: Mapping[str, Any] = {name: excluded[name] for name in values if name not in key}
    elif callable(set_):
        updates = set_(excluded)
    else:
        updates = set_
    if not updates:
        return insert.on_conflict_do_nothing(index_elements=list(key))
    return insert.on_conflict_do_update(index_elements=list(key), set_=dict(updates))
