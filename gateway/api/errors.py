"""Errors of the HTTP API: one JSON shape (OpenAI's) for every failure, with a message that says what to fix.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "voice", "code": "unknown_voice"}}

``ApiRoute`` is the route class of every API router: it turns ``ApiError`` and FastAPI's validation
errors into that shape (status 400 for bad input instead of FastAPI's 422 with its own shape, as OpenAI
does), so other routers of the app keep FastAPI's defaults. ``api_error()`` maps engine errors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException  # what FastAPI raises for a body it could not parse

from audio_codecs.errors import AudioCodecError
from gateway.service.limits import RateLimited
from gateway.store import StoreError, StoreUnavailable
from tts_engine.errors import (
    EngineClosed,
    EngineError,
    EngineOverloaded,
    EngineUnavailable,
    SynthesisFailed,
    UnknownVoice,
)

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented_error",
    503: "overloaded_error",
}


class ApiError(Exception):
    """An HTTP error answer: status, a clear message, and which request field is at fault."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        code: str = "invalid_request",
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})
        self.type = type

    def body(self) -> dict[str, Any]:
        default = _TYPES.get(self.status_code, "server_error" if self.status_code >= 500 else "error")
        error_type = self.type or default
        return {
            "error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def limit_error(exc: RateLimited) -> ApiError:
    """A request over its key's limits, as OpenAI answers it (gateway/service/limits.py): the error's
    ``type`` is ``requests`` or ``tokens`` (characters) for a rate, ``insufficient_quota`` for a quota."""
    kind = "insufficient_quota" if exc.code == "insufficient_quota" else "tokens" if exc.kind == "characters" else "requests"
    if exc.status != 429:
        kind = "invalid_request_error"
    param = "input" if exc.kind == "characters" else None
    return ApiError(exc.status, exc.message, code=exc.code, headers=exc.headers, type=kind, param=param)


def store_error(exc: StoreError) -> ApiError:
    """The store could not answer a request that needs it (keys, usage, quotas, batch jobs)."""
    if isinstance(exc, StoreUnavailable):
        return ApiError(503, f"the gateway's store is unavailable: {exc}", code="store_unavailable",
                        headers={"Retry-After": "2"})  # fmt: skip
    return ApiError(500, f"the gateway's store failed: {exc}", code="store_error")


def api_error(exc: Exception) -> ApiError:
    """The answer for an exception raised by the engine, the voice store or the codecs."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RateLimited):
        return limit_error(exc)
    if isinstance(exc, StoreError):
        return store_error(exc)
    if isinstance(exc, UnknownVoice):
        return ApiError(400, str(exc), code="unknown_voice", param="voice")
    if isinstance(exc, EngineOverloaded):
        return ApiError(503, f"TTS engine is busy: {exc}", code="overloaded", headers={"Retry-After": "1"})
    if isinstance(exc, EngineUnavailable):  # a worker went away (WorkerLost) or none is up
        return ApiError(
            503, f"TTS engine unavailable: {exc}", code="engine_unavailable", headers={"Retry-After": "1"}
        )
    if isinstance(exc, EngineClosed):
        return ApiError(503, "TTS engine is shutting down", code="engine_closed")
    if isinstance(exc, SynthesisFailed) and _is_voice_error(exc.cause):
        return ApiError(400, str(exc.cause), code="invalid_voice")  # e.g. a zero-shot prompt it cannot use
    if isinstance(exc, SynthesisFailed) and isinstance(exc.cause, ValueError):
        # The backend refused the input when opening the request (e.g. CosyVoice's 2000-character cap).
        return ApiError(400, f"the TTS backend refused the request: {exc.cause}", code="refused_by_backend")
    if isinstance(exc, SynthesisFailed):
        return ApiError(500, f"synthesis failed: {exc.cause}", code="synthesis_failed")
    if _is_voice_error(exc):
        return ApiError(400, str(exc), code="invalid_voice")
    if isinstance(exc, AudioCodecError | ValueError):
        return ApiError(400, str(exc))
    if isinstance(exc, EngineError):
        return ApiError(500, str(exc), code="engine_error")
    log.exception("unexpected API error", exc_info=exc)
    return ApiError(500, "internal error", code="internal_error")


def _is_voice_error(exc: BaseException) -> bool:
    try:
        from tts_engine.voices import VoiceError
    except ImportError:  # pragma: no cover - the voice store is part of the engine package
        return False
    return isinstance(exc, VoiceError)


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    """'input: Field required; speed: ...' and the first offending field's name (pydantic/FastAPI errors)."""
    problems: list[str] = []
    first: str | None = None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header", "form")]
        field = ".".join(loc) or "body"
        first = first or field
        problems.append(f"{field}: {err.get('msg', 'invalid')}")
    return "; ".join(problems) or "invalid request", first


class ApiRoute(APIRoute):
    """Answers ``ApiError`` and request validation errors in the API's JSON error shape.

    Bodies are capped before they get here, while they stream (``gateway.security.http_guard``: 413).
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                return exc.response()
            except HTTPException as exc:
                if isinstance(exc.__cause__, ApiError):  # raised while FastAPI read the body (forms.py)
                    return exc.__cause__.response()
                raise
            except RequestValidationError as exc:
                message, param = validation_message(exc.errors())
                return ApiError(400, message, code="invalid_request", param=param).response()

        return handle
