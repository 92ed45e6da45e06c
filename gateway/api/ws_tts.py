"""``WS /ws/tts``: many texts per connection, audio as base64 PCM in JSON messages, abort at any time.

Client -> server (JSON text frames):

    {"text": "你好", "voice": "default", "sample_rate": 24000, "speed": 1.0, "instruct": null, "id": "q1"}
    {"type": "abort"}              stop the text being spoken and drop the queued ones

Every field but ``text`` is optional (``type`` may be given as ``"tts"``); ``id`` defaults to a counter.
Texts are spoken one after another in the order they arrive. Server -> client:

    {"type": "audio_chunk", "id": "q1", "seq": 0, "sample_rate": 24000, "data": "<base64 s16le mono>"}
    {"type": "done", "id": "q1", "chunks": 12, "samples": 57600, "duration_s": 2.4, "sample_rate": 24000,
     "aborted": false}
    {"type": "error", "id": "q1", "status": 400, "code": "unknown_voice", "message": "..."}

Each text ends with exactly one ``done`` or ``error``; a bad message gets an ``error`` and the
connection stays open. While keys are needed (gateway/api/auth.py), the handshake needs
``Authorization: Bearer <key>`` or ``?api_key=<key>``; without one the connection is refused (HTTP 403).
Each text is a request of that key: its limits are checked when it is about to be spoken (an ``error``
with ``status`` 429, ``code`` and ``retry_after_s``), and it is metered like an HTTP request. Texts come
from the audio cache when the same one was spoken before. A client that disconnects aborts its engine
request at once.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocketDisconnect

from gateway.api.auth import websocket_account
from gateway.api.errors import ApiError, api_error, validation_message
from gateway.api.synthesis import (
    admit,
    check_sample_rate,
    check_text,
    check_voice_allowed,
    choose_voice,
    open_stream,
    served_reporter,
)
from gateway.service.accounts import Account
from gateway.service.limits import RateLimited
from gateway.service.served import Served
from gateway.services import Services
from gateway.store import StoreError
from tts_engine import SpeechStream
from tts_engine.engine import MAX_SPEED, MIN_SPEED
from tts_engine.errors import EngineError

log = logging.getLogger(__name__)

router = APIRouter(tags=["speech"])

MAX_QUEUED_TEXTS = 32
_POLICY_VIOLATION = 1008
_TRY_AGAIN_LATER = 1013


class WsTtsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["tts"] = "tts"
    id: str | None = Field(None, max_length=128)
    text: str
    voice: str | None = None
    sample_rate: int | None = None
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    instruct: str | None = None


@dataclass(frozen=True, slots=True)
class _Job:
    id: str
    text: str
    voice: str
    sample_rate: int
    speed: float
    instruct: str | None


@router.websocket("/ws/tts")
async def ws_tts(websocket: WebSocket) -> None:
    try:
        account = await websocket_account(websocket)
    except StoreError:
        await websocket.close(code=_TRY_AGAIN_LATER, reason="the gateway's store is unavailable")
        return
    if account is None:
        await websocket.close(code=_POLICY_VIOLATION, reason="missing or invalid API key")
        return
    await websocket.accept()
    await _WsTtsConnection(websocket, websocket.app.state.services, account).run()


class _WsTtsConnection:
    def __init__(self, websocket: WebSocket, services: Services, account: Account) -> None:
        self._ws = websocket
        self._services = services
        self._account = account
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._send_lock = asyncio.Lock()
        self._current: asyncio.Task[None] | None = None
        self._num_jobs = 0

    async def run(self) -> None:
        worker = asyncio.create_task(self._speak_all())
        try:
            await self._read_all()
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

    # -- reading --------------------------------------------------------------------------------

    async def _read_all(self) -> None:
        while True:
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                await self._error(
                    None, ApiError(400, "send JSON text messages, not binary", code="binary_message")
                )
                continue
            await self._handle(text)

    async def _handle(self, raw: str) -> None:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            await self._error(None, ApiError(400, f"message is not JSON: {exc}", code="bad_json"))
            return
        if not isinstance(data, dict):
            await self._error(None, ApiError(400, "message must be a JSON object", code="bad_message"))
            return
        if data.get("type") == "abort":
            await self._abort()
            return
        job_id = data.get("id") if isinstance(data.get("id"), str) else None
        try:
            job = self._make_job(WsTtsRequest.model_validate(data))
        except ValidationError as exc:
            message, param = validation_message(exc.errors())
            await self._error(job_id, ApiError(400, message, param=param))
            return
        except ApiError as exc:
            await self._error(job_id, exc)
            return
        if self._queue.qsize() >= MAX_QUEUED_TEXTS:
            limit = ApiError(
                429, f"more than {MAX_QUEUED_TEXTS} texts queued on this connection", code="queue_full"
            )
            await self._error(job.id, limit)
            return
        self._queue.put_nowait(job)

    def _make_job(self, request: WsTtsRequest) -> _Job:
        services = self._services
        self._num_jobs += 1
        voice = choose_voice(services, request.voice)
        check_voice_allowed(self._account, voice)
        return _Job(
            id=request.id or str(self._num_jobs),
            text=check_text(services, request.text),
            voice=voice,
            sample_rate=check_sample_rate(services, request.sample_rate),
            speed=request.speed,
            instruct=request.instruct,
        )

    async def _abort(self) -> None:
        dropped: list[_Job] = []
        while not self._queue.empty():
            dropped.append(self._queue.get_nowait())
        if self._current is not None:
            self._current.cancel()  # the task reports its own `done` (aborted)
        for job in dropped:
            await self._send(_aborted(job))

    # -- speaking -------------------------------------------------------------------------------

    async def _speak_all(self) -> None:
        while True:
            job = await self._queue.get()
            task = self._current = asyncio.create_task(self._speak(job))
            try:
                await asyncio.wait({task})  # an abort cancels the job's task, never this loop
            except asyncio.CancelledError:  # this loop is cancelled: the client left
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise
            finally:
                self._current = None
            if task.cancelled():  # aborted before it started: it could not report itself
                await self._send(_aborted(job))

    async def _speak(self, job: _Job) -> None:
        served = Served(self._account)
        services = self._services
        limited: str | None = None
        try:
            services.limiter.admit_request(self._account)
            await admit(services, self._account, served, job.text)
            stream = await open_stream(services, self._account, served, job.text, voice=job.voice,
                                       output_rate=job.sample_rate, speed=job.speed, instruct=job.instruct)  # fmt: skip
        except (ApiError, RateLimited) as exc:
            error = api_error(exc)
            served.status = error.status_code
            limited = exc.kind if isinstance(exc, RateLimited) else None
            if error.status_code == 429 and limited is None:
                limited = "limit"
            served.finish(served_reporter(services, limited=limited))
            await self._error(job.id, error)
            return
        served.status = 200
        try:
            await self._stream(job, stream, served)
        finally:
            served.finish(served_reporter(services))

    async def _stream(self, job: _Job, stream: SpeechStream, served: Served) -> None:
        num_chunks = num_samples = 0
        aborted = False
        try:
            async for chunk in stream:
                sent = await self._send({"type": "audio_chunk", "id": job.id, "seq": num_chunks,
                                         "sample_rate": job.sample_rate,
                                         "data": base64.b64encode(chunk.astype("<i2").tobytes()).decode()})  # fmt: skip
                if not sent:
                    return  # the client is gone; the reader sees the disconnect and ends the connection
                if served.first_byte_at is None:
                    served.first_byte_at = time.monotonic()
                num_chunks += 1
                num_samples += chunk.size
        except asyncio.CancelledError:
            aborted = True
        except EngineError as exc:
            served.failed = True
            await self._error(job.id, api_error(exc))
            return
        finally:
            await stream.aclose()
        await self._send({"type": "done", "id": job.id, "chunks": num_chunks, "samples": num_samples,
                          "duration_s": round(num_samples / job.sample_rate, 3),
                          "sample_rate": job.sample_rate, "aborted": aborted})  # fmt: skip

    # -- writing --------------------------------------------------------------------------------

    async def _error(self, job_id: str | None, exc: ApiError) -> None:
        message: dict[str, Any] = {"type": "error", "id": job_id, "status": exc.status_code, "code": exc.code,
                                   "message": exc.message}  # fmt: skip
        if "retry-after-ms" in exc.headers:
            message["retry_after_s"] = int(exc.headers["retry-after-ms"]) / 1000
        await self._send(message)

    async def _send(self, message: dict[str, Any]) -> bool:
        """False when the client is gone (the reader then sees the disconnect and ends the connection)."""
        async with self._send_lock:
            try:
                await self._ws.send_text(json.dumps(message, ensure_ascii=False))
            except (WebSocketDisconnect, RuntimeError):
                return False
        return True


def _aborted(job: _Job) -> dict[str, Any]:
    """The ``done`` of a text aborted before any of its audio was sent."""
    return {"type": "done", "id": job.id, "chunks": 0, "samples": 0, "duration_s": 0.0,
            "sample_rate": job.sample_rate, "aborted": True}  # fmt: skip
