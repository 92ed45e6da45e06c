"""Batch jobs (docs/service.md, "Batch jobs"): JSONL in (jsonl.py), jobs and items in the store
(store.py), worked through in the background by a ``BatchRunner`` (runner.py), results as a streamed
zip or tar (archive.py)."""

from gateway.service.batches.archive import ArchiveEntry, archive_name, stream_archive
from gateway.service.batches.jsonl import BatchInputError, BatchLine, parse_jsonl
from gateway.service.batches.runner import BatchRunner, result_name
from gateway.service.batches.store import BATCHES_SCHEMA, BatchStore, ItemRow, JobRow

__all__ = [
    "BATCHES_SCHEMA", "ArchiveEntry", "BatchInputError", "BatchLine", "BatchRunner", "BatchStore", "ItemRow",
    "JobRow", "archive_name", "parse_jsonl", "result_name", "stream_archive",
]  # fmt: skip
