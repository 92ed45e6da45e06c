"""Batch jobs of the speech API (gateway/service/batches, docs/service.md "Batch jobs").

- ``POST /v1/audio/batches``: the JSONL file as the body (``Content-Type: application/jsonl``, or
  multipart with a ``file`` field); up to ``batches.max_items`` lines and ``batches.max_file_bytes``
  (413). Every line is checked as ``/v1/audio/speech`` checks a request (400 lists the bad lines), the
  key's voices and quota included; then the job is stored and its id returned at once (200). A key may
  have ``batches.max_jobs_per_key`` unfinished jobs (429 ``too_many_batches``).
- ``GET /v1/audio/batches`` (``limit``, ``after``): the key's jobs, newest first (an admin sees all).
- ``GET /v1/audio/batches/{id}``: status and progress.
- ``GET /v1/audio/batches/{id}/results`` (``format=zip|tar``): the audio files so far plus
  ``manifest.jsonl`` (custom_id, file, duration_s, status, error), streamed as it is made.
- ``POST /v1/audio/batches/{id}/cancel``: waiting items are cancelled and running ones stopped now.
- ``DELETE /v1/audio/batches/{id}``: a finished job's results and rows go (409 while it runs).

A job belongs to the key that sent it; other keys get 404 (an admin key sees every job).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import ClientDisconnect

from gateway.api.auth import current_account, require_api_key
from gateway.api.errors import ApiError, ApiRoute, api_error
from gateway.api.synthesis import (
    check_audio_format,
    check_sample_rate,
    check_text,
    check_voice_allowed,
    choose_voice,
    services_of,
)
from gateway.service.accounts import Account
from gateway.service.batches import (
    ArchiveEntry,
    BatchInputError,
    BatchLine,
    BatchStore,
    JobRow,
    archive_name,
    parse_jsonl,
    stream_archive,
)
from gateway.service.limits import period_reset_s
from gateway.services import Services
from gateway.store import StoreError
from tts_engine.engine import MAX_SPEED, MIN_SPEED

log = logging.getLogger(__name__)

router = APIRouter(route_class=ApiRoute, dependencies=[Depends(require_api_key)], tags=["batches"])

MAX_LIST = 100


def job_json(job: JobRow) -> dict[str, Any]:
    finished = job.done + job.failed + job.cancelled
    return {
        "id": job.id, "object": "audio.batch", "status": job.status, "owner": job.owner,
        "created_at": job.created_at, "started_at": job.started_at, "finished_at": job.finished_at,
        "request_counts": {"total": job.total, "completed": job.done, "failed": job.failed,
                           "cancelled": job.cancelled, "pending": job.pending},
        "progress": round(finished / job.total, 4) if job.total else 1.0,
        "metadata": job.meta.get("metadata") or {},
    }  # fmt: skip


def _batches(services: Services) -> BatchStore:
    if services.batches is None:
        raise ApiError(404, "batch jobs are off here (batches.enabled: false)", code="batches_off")
    return services.batches


async def _own_job(services: Services, account: Account, job_id: str) -> JobRow:
    try:
        job = await _batches(services).job(job_id)
    except StoreError as exc:
        raise api_error(exc) from exc
    if job is None or (job.owner != account.name and not account.admin):
        raise ApiError(404, f"no batch job {job_id!r}", code="unknown_batch", param="id")
    return job


@router.post("/v1/audio/batches")
async def create_batch(request: Request) -> JSONResponse:
    """A batch job from a JSONL file of speech requests; answered at once with the job's id."""
    services = services_of(request)
    store = _batches(services)
    account = current_account(request)
    data, name = await _upload(request)
    try:
        lines = parse_jsonl(data, max_items=services.config.batches.max_items)
    except BatchInputError as exc:
        raise ApiError(400, f"the batch file has problems: {exc}", code="invalid_batch_file", param="file") from exc
    items = _checked(services, account, lines)
    chars = sum(count for _, _, count in items)
    await _check_quota(services, account, chars)
    meta = {"file": name, "metadata": {"lines": len(lines)}}
    try:
        job = await store.create(account.name, items, meta, max_unfinished=services.config.batches.max_jobs_per_key)
    except StoreError as exc:
        raise api_error(exc) from exc
    if job is None:
        limit = services.config.batches.max_jobs_per_key
        raise ApiError(429, f"key {account.name!r} has {limit} unfinished batch jobs (batches.max_jobs_per_key); "
                       "wait for one to finish or cancel one", code="too_many_batches",
                       headers={"x-should-retry": "false"})  # fmt: skip
    if services.batch_runner is not None:
        services.batch_runner.wake()
    log.info("batch %s: %d items (%d characters) from key %r", job.id, job.total, chars, account.name)
    return JSONResponse(job_json(job))


@router.get("/v1/audio/batches")
async def list_batches(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 20,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> JSONResponse:
    services = services_of(request)
    account = current_account(request)
    try:
        jobs = await _batches(services).jobs(None if account.admin else account.name, limit=limit + 1, after=after)
    except StoreError as exc:
        raise api_error(exc) from exc
    data = [job_json(job) for job in jobs[:limit]]
    return JSONResponse({"object": "list", "data": data, "has_more": len(jobs) > limit,
                         "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None})  # fmt: skip


@router.get("/v1/audio/batches/{job_id}")
async def get_batch(request: Request, job_id: str) -> JSONResponse:
    services = services_of(request)
    return JSONResponse(job_json(await _own_job(services, current_account(request), job_id)))


@router.post("/v1/audio/batches/{job_id}/cancel")
async def cancel_batch(request: Request, job_id: str) -> JSONResponse:
    """Cancels the job: its waiting items now, its running items' engine streams aborted before this answers."""
    services = services_of(request)
    await _own_job(services, current_account(request), job_id)
    try:
        job = await _batches(services).cancel(job_id)
    except StoreError as exc:
        raise api_error(exc) from exc
    if services.batch_runner is not None:
        await services.batch_runner.stop_job(job_id)
        job = await _batches(services).job(job_id) or job
    assert job is not None
    return JSONResponse(job_json(job))


@router.delete("/v1/audio/batches/{job_id}", status_code=204, response_class=Response)
async def delete_batch(request: Request, job_id: str) -> Response:
    services = services_of(request)
    job = await _own_job(services, current_account(request), job_id)
    if job.status not in ("completed", "cancelled"):
        raise ApiError(409, f"batch job {job_id} is {job.status}; cancel it first", code="batch_running")
    assert services.batch_runner is not None
    try:
        await _batches(services).delete(job_id)
    except StoreError as exc:
        raise api_error(exc) from exc
    await asyncio.to_thread(shutil.rmtree, services.batch_runner.folder / job_id, True)
    return Response(status_code=204)


@router.get("/v1/audio/batches/{job_id}/results")
async def batch_results(
    request: Request, job_id: str, format: Annotated[Literal["zip", "tar"] | None, Query()] = None
) -> StreamingResponse:
    """The results so far: audio files named after their custom_id, and manifest.jsonl."""
    services = services_of(request)
    job = await _own_job(services, current_account(request), job_id)
    fmt = format or services.config.batches.results_format
    try:
        items = await _batches(services).items(job_id)
    except StoreError as exc:
        raise api_error(exc) from exc
    assert services.batch_runner is not None
    folder = services.batch_runner.folder / job_id
    taken: set[str] = set()
    entries = []
    for item in items:
        name = archive_name(item.custom_id, item.idx, item.request["response_format"], taken) if item.file else None
        entries.append(ArchiveEntry(
            path=folder / item.file if item.file else None, name=name,
            manifest={"custom_id": item.custom_id, "file": name, "duration_s": item.duration_s,
                      "status": item.status, "error": item.error},
        ))  # fmt: skip
    media = "application/zip" if fmt == "zip" else "application/x-tar"
    headers = {"Content-Disposition": f'attachment; filename="{job_id}.{fmt}"', "X-Batch-Status": job.status}
    return StreamingResponse(stream_archive(entries, fmt), media_type=media, headers=headers)


# -- plumbing -------------------------------------------------------------------------------------


async def _upload(request: Request) -> tuple[bytes, str]:
    """The JSONL file: the body itself, or a multipart ``file`` field (both capped by the HTTP guard)."""
    content_type = request.headers.get("content-type", "")
    try:
        if content_type.startswith("multipart/form-data"):
            form = await request.form(max_files=1, max_fields=4, max_part_size=1 << 20)
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise ApiError(400, "send the JSONL file as the multipart field 'file'", code="missing_file",
                               param="file")  # fmt: skip
            return await upload.read(), upload.filename or "batch.jsonl"
        return await request.body(), "batch.jsonl"
    except ClientDisconnect:
        raise ApiError(400, "the upload was cut short", code="incomplete_upload") from None


def _checked(services: Services, account: Account, lines: list[BatchLine]) -> list[tuple[str, dict[str, Any], int]]:
    """Each line checked as /v1/audio/speech checks a request; 400 listing every bad line (up to 20)."""
    items: list[tuple[str, dict[str, Any], int]] = []
    problems: list[str] = []
    for line in lines:
        try:
            rate = check_sample_rate(services, line.sample_rate)
            check_audio_format(line.response_format, rate, param="response_format")
            check_text(services, line.input, param="input")
            if not MIN_SPEED <= line.speed <= MAX_SPEED:
                raise ApiError(400, f"speed must be within {MIN_SPEED}..{MAX_SPEED}", param="speed")
            voice = choose_voice(services, line.voice, lenient=True)
            check_voice_allowed(account, voice)
        except ApiError as exc:
            if len(problems) < 20:
                problems.append(f"line {line.line} ({line.custom_id}): {exc.message}")
            continue
        request = {**line.request(), "voice": voice, "sample_rate": rate, "owner": account.name,
                   "cache": account.cache}  # fmt: skip
        items.append((line.custom_id, request, len(line.input)))
    if problems:
        raise ApiError(400, "the batch file has problems: " + "; ".join(problems), code="invalid_batch_file",
                       param="file")  # fmt: skip
    return items


async def _check_quota(services: Services, account: Account, chars: int) -> None:
    """A job must fit in what is left of the key's character quota, and a key past its audio quota cannot
    send one (the audio a job will make is not known before it is made)."""
    limits = account.limits
    if limits.quota_chars is None and limits.quota_audio_s is None:
        return
    try:
        await services.usage.refresh_quota(account)
    except StoreError as exc:
        raise api_error(exc) from exc
    used, used_audio = services.usage.used(account)
    reset = period_reset_s(limits.quota_period)
    headers = {"Retry-After": str(int(reset) + 1), "x-should-retry": "false"}
    if limits.quota_chars is not None and chars > max(0, limits.quota_chars - used):
        left = max(0, limits.quota_chars - used)
        raise ApiError(429, f"this job has {chars} characters; key {account.name!r} has {left} left of its quota "
                       f"of {limits.quota_chars} per {limits.quota_period}", code="insufficient_quota",
                       type="insufficient_quota", headers=headers)  # fmt: skip
    if limits.quota_audio_s is not None and used_audio >= limits.quota_audio_s:
        raise ApiError(429, f"key {account.name!r} has used its quota of {limits.quota_audio_s:g} seconds of audio "
                       f"per {limits.quota_period}", code="insufficient_quota", type="insufficient_quota",
                       headers=headers)  # fmt: skip
