"""Usage metering: per API key (and per device) and UTC day, requests, characters, audio seconds produced,
errors and a first-byte latency histogram, kept in the store so it survives restarts.

``UsageMeter.record()`` is synchronous and cheap (a few additions in memory); a background task writes
what was recorded to the store every ``service.usage_flush_s`` as one transaction of upserts that add to
the day's row (``usage_daily``: one row per subject and day, counters plus ``fb_<i>`` histogram
buckets, so several gateways on one PostgreSQL add up), and ``aclose()`` writes the rest at shutdown.
While the store is down the counts wait in memory and are written when it is back. Reports (``GET
/v1/usage``, ``python -m gateway keys usage``) add what is not written yet, so they are exact at once.

Subjects: ``key:<name>`` for API keys (``anonymous`` while no key is needed), ``device:<Device-Id>``
for device turns (``record_device_turn``).

Quotas read ``used()``: the period's totals from the store (read again every ``refresh_s``, so other
gateways' usage counts) plus what this gateway recorded since, flushed or not.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Column, String, Table, func, select

from gateway.service.accounts import Account
from gateway.store import STORE_METADATA, Schema, Store, StoreError, StoreUnavailable, upsert

__all__ = ["FIRST_BYTE_BUCKETS", "USAGE_SCHEMA", "UsageMeter", "UsageRow", "day_of", "percentile_of"]

log = logging.getLogger(__name__)

# upper bounds (seconds) of the first-byte histogram's buckets; one more bucket holds the rest
FIRST_BYTE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
_COUNTERS = ("requests", "errors", "characters", "audio_us")
_FB = [f"fb_{i}" for i in range(len(FIRST_BYTE_BUCKETS) + 1)]

usage_daily = Table(
    "usage_daily",
    STORE_METADATA,
    Column("subject", String(200), primary_key=True),  # key:<name> | device:<id>
    Column("day", String(10), primary_key=True),  # YYYY-MM-DD, UTC
    *(Column(name, BigInteger, nullable=False, default=0) for name in (*_COUNTERS, *_FB)),
)
USAGE_SCHEMA = Schema("usage", (usage_daily,), version=1)


def day_of(at: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if at is None else at, UTC).strftime("%Y-%m-%d")


def key_subject(name: str) -> str:
    return f"key:{name}"


def device_subject(device_id: str) -> str:
    return f"device:{device_id[:192]}"


@dataclass
class _Delta:
    requests: int = 0
    errors: int = 0
    characters: int = 0
    audio_us: int = 0
    fb: list[int] = field(default_factory=lambda: [0] * len(_FB))

    def add(self, other: _Delta) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.characters += other.characters
        self.audio_us += other.audio_us
        self.fb = [a + b for a, b in zip(self.fb, other.fb, strict=True)]

    def values(self) -> dict[str, int]:
        return {"requests": self.requests, "errors": self.errors, "characters": self.characters,
                "audio_us": self.audio_us, **dict(zip(_FB, self.fb, strict=True))}  # fmt: skip


def percentile_of(histogram: list[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a first-byte histogram, interpolated inside its bucket (seconds)."""
    total = sum(histogram)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(histogram):
        if count and seen + count >= rank:
            low = FIRST_BYTE_BUCKETS[index - 1] if index > 0 else 0.0
            high = FIRST_BYTE_BUCKETS[index] if index < len(FIRST_BYTE_BUCKETS) else FIRST_BYTE_BUCKETS[-1] * 2
            return low + (high - low) * max(0.0, rank - seen) / count
        seen += count
    return FIRST_BYTE_BUCKETS[-1] * 2


@dataclass(frozen=True)
class UsageRow:
    """One subject's usage on one day (``GET /v1/usage`` rows)."""

    subject: str
    day: str
    requests: int
    errors: int
    characters: int
    audio_s: float
    first_byte: list[int]

    def as_dict(self) -> dict[str, Any]:
        kind, _, name = self.subject.partition(":")
        latency = {
            f"p{round(q * 100)}": None if (v := percentile_of(self.first_byte, q)) is None else round(v * 1000, 1)
            for q in (0.5, 0.95, 0.99)
        }
        return {
            "object": "usage.day", kind: name, "day": self.day, "requests": self.requests, "errors": self.errors,
            "characters": self.characters, "audio_seconds": round(self.audio_s, 3), "first_byte_ms": latency,
        }  # fmt: skip


class UsageMeter:
    """Usage per subject and day (module docstring)."""

    def __init__(self, store: Store | None, *, flush_s: float = 1.0, refresh_s: float = 5.0) -> None:
        self.store = store
        self.flush_s = flush_s
        self.refresh_s = refresh_s
        self._pending: dict[tuple[str, str], _Delta] = {}
        self._flushing: dict[tuple[str, str], _Delta] = {}
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()  # flushes and quota reads of the store do not interleave
        self._task: asyncio.Task[None] | None = None
        self._down = False
        # quota bases: (subject, period start) -> (characters, audio seconds) in the store, when read
        self._bases: dict[tuple[str, str], tuple[int, float, float]] = {}

    # ---- recording -------------------------------------------------------------------

    def record(
        self,
        subject: str,
        *,
        requests: int = 1,
        errors: int = 0,
        characters: int = 0,
        audio_s: float = 0.0,
        first_byte_s: float | None = None,
        at: float | None = None,
    ) -> None:
        delta = _Delta(requests=requests, errors=errors, characters=characters, audio_us=round(audio_s * 1e6))
        if first_byte_s is not None:
            delta.fb[bisect.bisect_left(FIRST_BYTE_BUCKETS, first_byte_s)] += 1
        key = (subject, day_of(at))
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = delta
        else:
            pending.add(delta)
        for (subject_, period), (chars, audio, read_at) in list(self._bases.items()):
            if subject_ == subject and key[1].startswith(period):
                self._bases[(subject_, period)] = (chars + delta.characters, audio + delta.audio_us / 1e6, read_at)
        self._dirty.set()

    def record_device_turn(
        self, device_id: str, *, characters: int, audio_s: float, first_audio_s: float | None, failed: bool
    ) -> None:
        """One device turn, metered like an API request of the device."""
        self.record(device_subject(device_id), characters=characters, audio_s=audio_s,
                    first_byte_s=first_audio_s, errors=int(failed))  # fmt: skip

    # ---- the store -------------------------------------------------------------------

    async def start(self) -> None:
        if self.store is not None and self._task is None:
            self._task = asyncio.create_task(self._flusher(), name="usage flusher")

    async def _flusher(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.flush_s)  # gathers what comes in meanwhile into one transaction
            await self.flush()

    async def flush(self) -> bool:
        """Writes what was recorded; False when the store is down (kept for the next try)."""
        if self.store is None:
            return True
        async with self._lock:
            self._dirty.clear()
            if not self._pending:
                return True
            self._flushing, self._pending = self._pending, {}
            try:
                async with self.store.write() as conn:
                    for (subject, day), delta in self._flushing.items():
                        values = {"subject": subject, "day": day, **delta.values()}
                        await conn.execute(upsert(conn.dialect.name, usage_daily, values, key=["subject", "day"],
                                                  set_=_adding))  # fmt: skip
            except StoreError as exc:
                for key, delta in self._flushing.items():  # back into pending, before anything newer
                    newer = self._pending.get(key)
                    if newer is not None:
                        delta.add(newer)
                    self._pending[key] = delta
                self._flushing = {}
                if not self._down:
                    log.warning("usage not written to the store yet (%s); kept in memory", exc)
                self._down = True
                self._dirty.set()
                return False
            self._flushing = {}
            if self._down:
                log.info("usage written to the store again")
            self._down = False
            return True

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._pending and not await self.flush():
            lost = sum(d.requests for d in self._pending.values())
            log.error("usage of %d request(s) could not be written at shutdown (the store is down)", lost)

    # ---- quotas ----------------------------------------------------------------------

    async def refresh_quota(self, account: Account) -> None:
        """Reads the period's totals of ``account`` from the store when older than ``refresh_s``.
        Keeps the last ones while the store is down; ``StoreUnavailable`` when none were ever read."""
        limits = account.limits
        if self.store is None or (limits.quota_chars is None and limits.quota_audio_s is None):
            return
        subject, period = key_subject(account.name), _period_start(limits.quota_period)
        base = self._bases.get((subject, period))
        if base is not None and time.monotonic() - base[2] < self.refresh_s:
            return
        async with self._lock:
            base = self._bases.get((subject, period))
            if base is not None and time.monotonic() - base[2] < self.refresh_s:
                return
            query = select(func.coalesce(func.sum(usage_daily.c.characters), 0),
                           func.coalesce(func.sum(usage_daily.c.audio_us), 0)).where(
                usage_daily.c.subject == subject, usage_daily.c.day >= _first_day(period))  # fmt: skip
            try:
                async with self.store.read() as conn:
                    chars, audio_us = (await conn.execute(query)).one()
            except StoreUnavailable:
                if base is not None:
                    return
                raise
            # what this gateway recorded and has not written yet counts on top of the store's totals
            for (subject_, day), delta in self._pending.items():
                if subject_ == subject and day.startswith(period):
                    chars += delta.characters
                    audio_us += delta.audio_us
            self._bases[(subject, period)] = (int(chars), int(audio_us) / 1e6, time.monotonic())

    def used(self, account: Account) -> tuple[int, float]:
        """(characters, audio seconds) of ``account``'s quota period so far (see ``refresh_quota``)."""
        period = _period_start(account.limits.quota_period)
        base = self._bases.get((key_subject(account.name), period))
        return (0, 0.0) if base is None else (base[0], base[1])

    # ---- reports ---------------------------------------------------------------------

    async def report(self, subjects: Iterable[str] | None = None, *, days: int = 7) -> list[UsageRow]:
        """Rows of the last ``days`` days (today included), of ``subjects`` or everyone, with what is not
        written yet; newest day first, then by subject."""
        since = day_of(time.time() - (days - 1) * 86400)
        wanted = None if subjects is None else set(subjects)
        totals: dict[tuple[str, str], _Delta] = {}
        if self.store is not None:
            query = select(usage_daily).where(usage_daily.c.day >= since)
            if wanted is not None:
                query = query.where(usage_daily.c.subject.in_(sorted(wanted)))
            async with self.store.read() as conn:
                for row in (await conn.execute(query)).mappings():
                    totals[(row["subject"], row["day"])] = _Delta(
                        requests=row["requests"], errors=row["errors"], characters=row["characters"],
                        audio_us=row["audio_us"], fb=[row[name] for name in _FB],
                    )  # fmt: skip
        for source in (self._flushing, self._pending):
            for key, delta in source.items():
                if key[1] >= since and (wanted is None or key[0] in wanted):
                    totals.setdefault(key, _Delta()).add(delta)
        rows = [
            UsageRow(subject, day, d.requests, d.errors, d.characters, d.audio_us / 1e6, list(d.fb))
            for (subject, day), d in totals.items()
        ]
        rows.sort(key=lambda r: (r.day, r.subject))
        rows.sort(key=lambda r: r.day, reverse=True)
        return rows


def _adding(new: Any) -> dict[str, Any]:
    return {name: usage_daily.c[name] + new[name] for name in (*_COUNTERS, *_FB)}


def _period_start(period: str) -> str:
    """'YYYY-MM-DD' (day) or 'YYYY-MM' (month): the prefix every day of the current period starts with."""
    today = day_of()
    return today if period == "day" else today[:7]


def _first_day(prefix: str) -> str:
    return prefix if len(prefix) == 10 else prefix + "-01"

