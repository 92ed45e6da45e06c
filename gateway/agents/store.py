"""Agents in the gateway's store (gateway/store): their tables and the edits, each one transaction.

``agents_agents`` holds each agent's current profile (JSON) and its version; ``agents_revisions`` the
profiles of its last ``REVISIONS_KEPT`` versions (what an edit replaced, for an operator who wants it
back). An edit writes the new revision, then the agent's row only if its version is still the one the
editor read (``expected_version``: two consoles editing one agent do not overwrite each other), then
drops revisions past the kept ones: all in one transaction, so a gateway killed half way leaves the
agent as it was (tests/test_devices_kill.py kills one there).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    Float,
    ForeignKey,
    Integer,
    Row,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.agents.profile import AgentProfile
from gateway.store import STORE_METADATA, Schema, Store

__all__ = [
    "AGENTS_SCHEMA", "AgentExists", "AgentNotFound", "AgentStore", "StoredAgent", "TooManyAgents",
    "VersionConflict", "agents_agents", "parse_profile",
]  # fmt: skip

REVISIONS_KEPT = 10
NAME_CHARS = 48

agents_agents = Table(
    "agents_agents",
    STORE_METADATA,
    Column("name", String(NAME_CHARS), primary_key=True),
    Column("profile", Text, nullable=False),  # AgentProfile as JSON
    Column("version", Integer, nullable=False),
    Column("created_at", Float, nullable=False),  # unix seconds
    Column("updated_at", Float, nullable=False),
)
agents_revisions = Table(
    "agents_revisions",
    STORE_METADATA,
    Column(
        "agent", String(NAME_CHARS), ForeignKey("agents_agents.name", ondelete="CASCADE"), primary_key=True
    ),
    Column("version", Integer, primary_key=True),
    Column("profile", Text, nullable=False),
    Column("changed_at", Float, nullable=False),
)

AGENTS_SCHEMA = Schema("agents", (agents_agents, agents_revisions), version=1)


class AgentNotFound(LookupError):
    """No agent of that name."""


class AgentExists(ValueError):
    """An agent of that name exists already."""


class VersionConflict(ValueError):
    """The agent changed since the editor read it."""


class TooManyAgents(ValueError):
    """``agents.max_agents`` are stored already."""


@dataclass(frozen=True)
class StoredAgent:
    profile: AgentProfile
    version: int
    created_at: float
    updated_at: float

    def public(self) -> dict[str, object]:
        return {**self.profile.public(), "version": self.version, "created_at": self.created_at,
                "updated_at": self.updated_at}  # fmt: skip


def parse_profile(text: str) -> AgentProfile:
    """A stored profile (validated again: a row edited by hand cannot reach a turn unchecked)."""
    return AgentProfile.model_validate(json.loads(text))


def _dump(profile: AgentProfile) -> str:
    return json.dumps(profile.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))


class AgentStore:
    """The agents' edits and reads; each method is one bounded store transaction (``StoreError``)."""

    def __init__(self, store: Store, *, max_agents: int = 200) -> None:
        self.store = store
        self.max_agents = max_agents

    async def list_agents(self) -> list[StoredAgent]:
        async with self.store.read() as conn:
            rows = (await conn.execute(select(agents_agents).order_by(agents_agents.c.name))).all()
        return [_stored(row) for row in rows]

    async def get(self, name: str) -> StoredAgent | None:
        async with self.store.read() as conn:
            row = (await conn.execute(select(agents_agents).where(agents_agents.c.name == name))).first()
        return _stored(row) if row is not None else None

    async def create(self, profile: AgentProfile) -> StoredAgent:
        now = time.time()
        async with self.store.write() as conn:
            count = (await conn.execute(select(func.count()).select_from(agents_agents))).scalar_one()
            if (await _version(conn, profile.name)) is not None:
                raise AgentExists(f"agent {profile.name!r} exists already")
            if count >= self.max_agents:
                raise TooManyAgents(f"{count} agents are stored, the most agents.max_agents allows")
            text = _dump(profile)
            await conn.execute(
                insert(agents_agents).values(
                    name=profile.name, profile=text, version=1, created_at=now, updated_at=now
                )  # fmt: skip
            )
            await conn.execute(
                insert(agents_revisions).values(agent=profile.name, version=1, profile=text, changed_at=now)
            )
        return StoredAgent(profile, 1, now, now)

    async def update(self, profile: AgentProfile, *, expected_version: int | None = None) -> StoredAgent:
        """Replaces the agent's profile; ``expected_version``: refuse if it changed since (VersionConflict)."""
        now = time.time()
        text = _dump(profile)
        async with self.store.write() as conn:
            row = (
                await conn.execute(
                    select(agents_agents.c.version, agents_agents.c.created_at).where(
                        agents_agents.c.name == profile.name
                    )
                )
            ).first()
            if row is None:
                raise AgentNotFound(f"no agent {profile.name!r}")
            version, created_at = row
            if expected_version is not None and expected_version != version:
                raise VersionConflict(
                    f"agent {profile.name!r} is at version {version}, not {expected_version}: reload it"
                )
            # the revision first, then the agent: a transaction cut between them leaves neither
            await conn.execute(
                insert(agents_revisions).values(
                    agent=profile.name, version=version + 1, profile=text, changed_at=now
                )
            )
            changed = await conn.execute(
                update(agents_agents)
                .where(agents_agents.c.name == profile.name, agents_agents.c.version == version)
                .values(profile=text, version=version + 1, updated_at=now)
            )
            if changed.rowcount != 1:  # edited by another gateway between our read and write
                raise VersionConflict(f"agent {profile.name!r} changed meanwhile: reload it")
            await conn.execute(
                delete(agents_revisions).where(
                    agents_revisions.c.agent == profile.name,
                    agents_revisions.c.version <= version + 1 - REVISIONS_KEPT,
                )
            )
        return StoredAgent(profile, version + 1, created_at, now)

    async def delete(self, name: str) -> bool:
        """Removes the agent (its revisions go with it; its devices fall back to the default agent)."""
        async with self.store.write() as conn:
            result = await conn.execute(delete(agents_agents).where(agents_agents.c.name == name))
        return result.rowcount > 0

    async def revisions(self, name: str) -> list[tuple[int, float]]:
        """(version, changed at) of the kept revisions, newest first."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(
                    select(agents_revisions.c.version, agents_revisions.c.changed_at)
                    .where(agents_revisions.c.agent == name)
                    .order_by(agents_revisions.c.version.desc())
                )
            ).all()
        return [(int(v), float(t)) for v, t in rows]


async def _version(conn: AsyncConnection, name: str) -> int | None:
    row = (await conn.execute(select(agents_agents.c.version).where(agents_agents.c.name == name))).first()
    return None if row is None else int(row[0])


def _stored(row: Row[Any]) -> StoredAgent:
    mapping = row._mapping
    return StoredAgent(
        parse_profile(mapping["profile"]),
        int(mapping["version"]),
        float(mapping["created_at"]),
        float(mapping["updated_at"]),
    )
