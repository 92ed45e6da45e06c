"""The gateway's persistent data: one store (SQLite by default, PostgreSQL to share it), docs/store.md.

``Store`` (store.py) opens the database and gives bounded transactions; feature modules declare their
tables on ``STORE_METADATA`` and register a ``Schema`` (schema.py) in ``gateway/services.py``'s
``STORE_SCHEMAS``; ``upsert`` (sql.py) is the one statement that is spelled differently per engine.
"""

from gateway.store.errors import StoreConflict, StoreError, StoreUnavailable
from gateway.store.schema import STORE_METADATA, Schema, add_column, create_tables, run_sql
from gateway.store.sql import upsert
from gateway.store.store import Store

__all__ = [
    "STORE_METADATA", "Schema", "Store", "StoreConflict", "StoreError", "StoreUnavailable", "add_column",
    "create_tables", "run_sql", "upsert",
]  # fmt: skip
