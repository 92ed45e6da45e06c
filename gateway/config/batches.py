"""The `batches` section: batch jobs of the speech API (gateway/service/batches, docs/service.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config.base import Section


class BatchesConfig(Section):
    """POST /v1/audio/batches: JSONL in, a job in the store, audio files in a folder, a zip out."""

    enabled: bool = True
    # Result files, one folder per job (relative to the project root).
    dir: str = "data/batches"
    max_items: int = Field(10_000, ge=1, le=1_000_000)  # lines per job
    max_file_bytes: int = Field(32 * 1024 * 1024, ge=1024, le=1 << 31)  # the JSONL upload
    max_jobs_per_key: int = Field(4, ge=1, le=10_000)  # unfinished jobs per key at once
    # Items this gateway synthesises at once (engine priority "batch": they fill capacity the device
    # turns and API streams leave free).
    concurrency: int = Field(8, ge=1, le=1024)
    # Tries per item before it is recorded as failed; the wait between tries doubles from retry_s.
    max_attempts: int = Field(3, ge=1, le=20)
    retry_s: float = Field(1.0, ge=0, le=600)
    item_timeout_s: float = Field(600.0, gt=0, le=86400)  # one item, end to end
    # An item a gateway works on is leased for this long (renewed while it works); a gateway that died
    # leaves its items to others (or to itself after a restart) once the lease ran out.
    lease_s: float = Field(30.0, ge=1, le=3600)
    # How often a runner looks in the store for work it was not told about (jobs sent to another
    # gateway, leases that ran out); a job sent to this gateway starts at once.
    scan_s: float = Field(5.0, ge=0.1, le=3600)
    results_format: Literal["zip", "tar"] = "zip"  # of GET .../results unless ?format= says
