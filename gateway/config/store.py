"""The `store` section: where the gateway keeps its data (gateway/store, docs/store.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from gateway.config.base import Section


class StoreConfig(Section):
    # sqlite:///FILE (relative to the project root) or postgresql://USER:PASSWORD@HOST:PORT/DATABASE;
    # never logged with its password (repr=False keeps it out of reprs too)
    url: str = Field(
        "sqlite:///data/gateway.db", repr=False, pattern=r"^\s*(sqlite|postgres|postgresql)(\+\w+)?://"
    )
    pool_size: int = Field(5, ge=1, le=200)  # connections kept open
    max_overflow: int = Field(5, ge=0, le=200)  # more, opened under load and closed after
    connect_timeout_s: float = Field(5, gt=0, le=120)  # PostgreSQL: one connection attempt
    timeout_s: float = Field(5, gt=0, le=300)  # one store call, end to end (pool wait, statements, commit)
    migrate_timeout_s: float = Field(120, gt=0, le=3600)  # the schema migrations at start-up

    @field_validator("url")
    @classmethod
    def _supported_url(cls, v: str) -> str:
        from gateway.store.url import store_url  # the one parser (ValueError messages never quote the URL)

        store_url(v, root=Path("."))  # relative SQLite paths are resolved against the project root later
        return v.strip()
