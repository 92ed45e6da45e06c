"""Batch jobs and their items in the store: ``batches_jobs`` (one row per job, with its counters) and
``batches_items`` (one row per input line, its state, its result file).

An item is ``pending`` (waiting; ``not_before`` delays a retry), ``running`` (claimed by one runner,
``owner``, until ``lease_until``; the runner renews the lease while it works), ``done`` (its file is in
the job's folder), ``failed`` (after ``batches.max_attempts`` tries, or input the engine refuses) or
``cancelled``. Claiming is one transaction (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so gateways sharing
the store never take the same item; SQLite: the write lock), and so is finishing an item: its state, the
job's counters and, once nothing is left, the job's own state change together. A runner killed mid-way
leaves its items ``running`` with a lease that runs out; the next runner (another gateway, or this one
after a restart) takes them again.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from gateway.store import STORE_METADATA, Schema, Store

__all__ = [
    "BATCHES_SCHEMA", "FINISHED", "UNFINISHED", "BatchStore", "ItemRow", "JobRow", "new_job_id",
]  # fmt: skip

batches_jobs = Table(
    "batches_jobs",
    STORE_METADATA,
    Column("id", String(40), primary_key=True),
    Column("owner", String(64), nullable=False),  # the key's name
    Column("status", String(16), nullable=False),  # queued, running, completed, cancelled
    Column("created_at", Float, nullable=False),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    Column("total", Integer, nullable=False),
    Column("done", Integer, nullable=False, default=0),
    Column("failed", Integer, nullable=False, default=0),
    Column("cancelled", Integer, nullable=False, default=0),
    Column("meta", Text, nullable=False),  # JSON: the upload's name, metadata
    Index("batches_jobs_by_owner", "owner", "created_at"),
)
batches_items = Table(
    "batches_items",
    STORE_METADATA,
    Column("job_id", String(40), ForeignKey("batches_jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("idx", Integer, primary_key=True),  # the line's place in the input, from 0
    Column("custom_id", String(256), nullable=False),
    Column("request", Text, nullable=False),  # JSON: input, voice, response_format, speed, ...
    Column("chars", Integer, nullable=False),
    Column("status", String(12), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("owner", String(64), nullable=True),  # the runner working on it
    Column("lease_until", Float, nullable=True),
    Column("not_before", Float, nullable=False, default=0.0),
    Column("file", String(300), nullable=True),  # in the job's folder
    Column("duration_s", Float, nullable=True),
    Column("error", Text, nullable=True),
    Column("finished_at", Float, nullable=True),
    Index("batches_items_by_state", "status", "job_id"),
)
BATCHES_SCHEMA = Schema("batches", (batches_jobs, batches_items), version=1)

UNFINISHED = ("queued", "running")
FINISHED = ("completed", "cancelled")
INSERT_CHUNK = 500  # items per INSERT statement (each statement stays within the store's bound)


def new_job_id() -> str:
    return "batch_" + secrets.token_hex(12)


@dataclass(frozen=True)
class JobRow:
    id: str
    owner: str
    status: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    total: int
    done: int
    failed: int
    cancelled: int
    meta: dict[str, Any]

    @property
    def pending(self) -> int:
        return self.total - self.done - self.failed - self.cancelled


@dataclass(frozen=True)
class ItemRow:
    job_id: str
    idx: int
    custom_id: str
    request: dict[str, Any]
    chars: int
    status: str
    attempts: int
    file: str | None
    duration_s: float | None
    error: str | None


def _job(row: Any) -> JobRow:
    return JobRow(id=row["id"], owner=row["owner"], status=row["status"], created_at=row["created_at"],
                  started_at=row["started_at"], finished_at=row["finished_at"], total=row["total"],
                  done=row["done"], failed=row["failed"], cancelled=row["cancelled"],
                  meta=json.loads(row["meta"]))  # fmt: skip


def _item(row: Any) -> ItemRow:
    return ItemRow(job_id=row["job_id"], idx=row["idx"], custom_id=row["custom_id"],
                   request=json.loads(row["request"]), chars=row["chars"], status=row["status"],
                   attempts=row["attempts"], file=row["file"], duration_s=row["duration_s"],
                   error=row["error"])  # fmt: skip


class BatchStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    # ---- jobs ------------------------------------------------------------------------

    async def create(self, owner: str, items: Sequence[tuple[str, dict[str, Any], int]],
                     meta: dict[str, Any], *, max_unfinished: int) -> JobRow | None:  # fmt: skip
        """A new job of ``items`` (custom_id, request, characters); None when ``owner`` has
        ``max_unfinished`` unfinished jobs already (checked in the same transaction)."""
        now = time.time()
        job_id = new_job_id()
        bound = self.store.timeout_s * (2 + len(items) // INSERT_CHUNK)
        async with self.store.write(timeout_s=bound) as conn:
            running = (await conn.execute(
                select(func.count()).select_from(batches_jobs)
                .where(batches_jobs.c.owner == owner, batches_jobs.c.status.in_(UNFINISHED))
            )).scalar_one()  # fmt: skip
            if running >= max_unfinished:
                return None
            await conn.execute(insert(batches_jobs).values(
                id=job_id, owner=owner, status="queued", created_at=now, total=len(items), done=0, failed=0,
                cancelled=0, meta=json.dumps(meta),
            ))  # fmt: skip
            rows = [{"job_id": job_id, "idx": idx, "custom_id": custom_id, "request": json.dumps(request),
                     "chars": chars, "status": "pending", "attempts": 0, "not_before": 0.0}
                    for idx, (custom_id, request, chars) in enumerate(items)]  # fmt: skip
            for at in range(0, len(rows), INSERT_CHUNK):
                await conn.execute(insert(batches_items), rows[at : at + INSERT_CHUNK])
        job = await self.job(job_id)
        assert job is not None
        return job

    async def job(self, job_id: str) -> JobRow | None:
        async with self.store.read() as conn:
            row = (await conn.execute(select(batches_jobs).where(batches_jobs.c.id == job_id))).mappings().first()
        return None if row is None else _job(row)

    async def jobs(self, owner: str | None, *, limit: int, after: str | None = None) -> list[JobRow]:
        """Newest first; ``after`` a job id: the ones older than it."""
        query = select(batches_jobs).order_by(batches_jobs.c.created_at.desc(), batches_jobs.c.id.desc())
        if owner is not None:
            query = query.where(batches_jobs.c.owner == owner)
        async with self.store.read() as conn:
            if after is not None:
                at = (await conn.execute(select(batches_jobs.c.created_at).where(batches_jobs.c.id == after))).first()
                if at is not None:
                    query = query.where(or_(batches_jobs.c.created_at < at[0],
                                            and_(batches_jobs.c.created_at == at[0], batches_jobs.c.id < after)))  # fmt: skip
            rows = (await conn.execute(query.limit(limit))).mappings().all()
        return [_job(row) for row in rows]

    async def items(self, job_id: str) -> list[ItemRow]:
        query = select(batches_items).where(batches_items.c.job_id == job_id).order_by(batches_items.c.idx)
        async with self.store.read(timeout_s=self.store.timeout_s * 4) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_item(row) for row in rows]

    async def cancel(self, job_id: str) -> JobRow | None:
        """Cancels an unfinished job: its waiting items are cancelled now, the running ones by their runner."""
        now = time.time()
        async with self.store.write() as conn:
            status = (await conn.execute(select(batches_jobs.c.status).where(batches_jobs.c.id == job_id))).first()
            if status is not None and status[0] in UNFINISHED:
                waiting = await conn.execute(
                    update(batches_items)
                    .where(batches_items.c.job_id == job_id, batches_items.c.status == "pending")
                    .values(status="cancelled", finished_at=now)
                )
                await conn.execute(update(batches_jobs).where(batches_jobs.c.id == job_id).values(
                    status="cancelled", finished_at=now,
                    cancelled=batches_jobs.c.cancelled + waiting.rowcount,
                ))  # fmt: skip
        return await self.job(job_id)

    async def delete(self, job_id: str) -> None:
        async with self.store.write() as conn:
            await conn.execute(delete(batches_items).where(batches_items.c.job_id == job_id))
            await conn.execute(delete(batches_jobs).where(batches_jobs.c.id == job_id))

    # ---- the runner's side ---------------------------------------------------------------

    async def claim(self, runner: str, n: int, lease_s: float) -> list[ItemRow]:
        """Up to ``n`` items to work on (oldest job first): waiting ones whose retry time came, and running
        ones whose lease ran out; each gets one more attempt and a lease of ``lease_s``."""
        now = time.time()
        items, jobs = batches_items, batches_jobs
        ready = or_(and_(items.c.status == "pending", items.c.not_before <= now),
                    and_(items.c.status == "running", items.c.lease_until < now))  # fmt: skip
        query = (
            select(items.c.job_id, items.c.idx)
            .join(jobs, jobs.c.id == items.c.job_id)
            .where(jobs.c.status.in_(UNFINISHED), ready)
            .order_by(jobs.c.created_at, items.c.job_id, items.c.idx)
            .limit(n)
            .with_for_update(of=items, skip_locked=True)
        )
        async with self.store.write() as conn:
            picked = (await conn.execute(query)).all()
            claimed: list[ItemRow] = []
            for job_id, idx in picked:
                await conn.execute(update(items).where(items.c.job_id == job_id, items.c.idx == idx).values(
                    status="running", owner=runner, lease_until=now + lease_s, attempts=items.c.attempts + 1,
                ))  # fmt: skip
            for job_id in {job_id for job_id, _ in picked}:
                await conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.status == "queued")
                                   .values(status="running", started_at=now))  # fmt: skip
            if picked:
                rows = (await conn.execute(select(items).where(
                    or_(*(and_(items.c.job_id == job_id, items.c.idx == idx) for job_id, idx in picked))
                ))).mappings().all()  # fmt: skip
                claimed = sorted((_item(row) for row in rows), key=lambda i: (i.job_id, i.idx))
        return claimed

    async def renew(self, runner: str, keys: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """Extends the leases of ``runner``'s items; returns the ids of their jobs that are no longer
        unfinished (cancelled: the runner stops those items)."""
        if not keys:
            return set()
        items, jobs = batches_items, batches_jobs
        job_ids = sorted({job_id for job_id, _ in keys})
        async with self.store.write() as conn:
            await conn.execute(update(items).where(
                items.c.owner == runner, items.c.status == "running", items.c.job_id.in_(job_ids),
            ).values(lease_until=time.time() + lease_s))  # fmt: skip
            rows = (await conn.execute(select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_(job_ids)))).all()
        return {job_id for job_id, status in rows if status not in UNFINISHED} | (set(job_ids) - {r[0] for r in rows})

    async def finish(self, item: ItemRow, runner: str, *, status: str, file: str | None = None,
                     duration_s: float | None = None, error: str | None = None,
                     retry_at: float | None = None) -> bool:  # fmt: skip
        """Records an item's outcome (``done``, ``failed``, ``cancelled``, or ``pending`` again with
        ``retry_at``) if ``runner`` still holds it; the job's counters and state follow in the same
        transaction. False when the item was no longer this runner's (its lease ran out and another
        runner took it): nothing is written."""
        now = time.time()
        items, jobs = batches_items, batches_jobs
        mine = and_(items.c.job_id == item.job_id, items.c.idx == item.idx, items.c.owner == runner,
                    items.c.status == "running")  # fmt: skip
        async with self.store.write() as conn:
            values: dict[str, Any] = {"status": status, "owner": None, "lease_until": None, "error": error}
            if status == "pending":
                values["not_before"] = retry_at or now
            else:
                values.update(file=file, duration_s=duration_s, finished_at=now)
            result = await conn.execute(update(items).where(mine).values(**values))
            if not result.rowcount:
                return False
            if status in ("done", "failed", "cancelled"):
                counter = {"done": jobs.c.done, "failed": jobs.c.failed, "cancelled": jobs.c.cancelled}[status]
                await conn.execute(update(jobs).where(jobs.c.id == item.job_id).values({counter: counter + 1}))
                left = (await conn.execute(select(func.count()).select_from(items).where(
                    items.c.job_id == item.job_id, items.c.status.in_(("pending", "running")),
                ))).scalar_one()  # fmt: skip
                if not left:
                    await conn.execute(update(jobs).where(jobs.c.id == item.job_id, jobs.c.status.in_(UNFINISHED))
                                       .values(status="completed", finished_at=now))  # fmt: skip
        return True

    async def release(self, runner: str, keys: Sequence[tuple[str, int]]) -> None:
        """Gives items back untouched (a clean shutdown): waiting again, this attempt not counted."""
        items = batches_items
        async with self.store.write() as conn:
            for job_id, idx in keys:
                await conn.execute(update(items).where(
                    items.c.job_id == job_id, items.c.idx == idx, items.c.owner == runner, items.c.status == "running",
                ).values(status="pending", owner=None, lease_until=None, attempts=items.c.attempts - 1))  # fmt: skip
