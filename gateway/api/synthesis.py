"""What every speech endpoint shares: checking a request, opening an engine stream, watching the client.

Every request uses the one engine in ``request.app.state.services.engine``. A client that goes away
aborts its engine request at once:

- while the handler waits (the first chunk of a stream, or the whole audio of a file), a watcher on
  the ASGI ``receive`` channel sees ``http.disconnect`` and cancels the wait, which aborts the stream;
- while a streamed body is being sent, Starlette cancels the body on disconnect, and
  ``EngineStreamingResponse`` aborts the engine stream however the response ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import HTTPConnection
from starlette.types import Receive, Scope, Send

from audio_codecs.formats import StreamingEncoder, UnsupportedFormat, check_format
from gateway.api.errors import ApiError, api_error
from gateway.service.accounts import Account
from gateway.service.limits import RateLimited, SpeechTicket
from gateway.service.served import CountingStream, Served
from gateway.service.speech import open_speech
from gateway.service.usage import key_subject
from gateway.services import Services
from gateway.speech.text_cleaning import has_speech, lone_surrogate_at
from gateway.store import StoreError
from tts_engine import OUTPUT_RATES, SpeechStream
from tts_engine.errors import EngineError, UnknownVoice

log = logging.getLogger(__name__)

T = TypeVar("T")

CLIENT_GONE_STATUS = 499  # nginx's "client closed request"; nobody reads it


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


def services_of(request: Request) -> Services:
    return request.app.state.services


def choose_voice(
    services: Services, voice: str | None, *, param: str = "voice", lenient: bool = False
) -> str:
    """The voice an API request speaks in, as the engine resolves it (its one resolver,
    ``SpeechEngine.resolve_voice``: the name itself, the default for none), after the API's own policy:
    an alias (``api.voice_aliases``) stands for its target, and ``lenient`` endpoints (the HTTP speech
    endpoints that the incumbent's providers and OpenAI clients call) speak an unknown name in the
    default voice while ``api.unknown_voice`` is ``fallback``, logging each such name once. Else 400.
    """
    engine = services.engine
    name = voice or None
    try:
        return engine.resolve_voice(name)
    except UnknownVoice:
        pass
    assert name is not None  # the default voice always resolves
    fallback = lenient and services.config.api.unknown_voice == "fallback"
    aliases = services.config.api.voice_aliases
    if name in aliases:
        target = aliases[name] or None
        try:
            return engine.resolve_voice(target)
        except UnknownVoice:
            if not fallback:
                raise ApiError(400, f"voice {name!r} is an alias of {target or engine.default_voice!r}, which is "
                               "not loaded", code="unknown_voice", param=param) from None  # fmt: skip
    if fallback:
        _report_fallback(name, engine.default_voice)
        return engine.resolve_voice(None)
    raise ApiError(
        400,
        f"unknown voice {name[:_MAX_VOICE_SHOWN]!r}; available: {', '.join(engine.voices)} (see GET /v1/voices)",
        code="unknown_voice",
        param=param,
    )


_MAX_VOICE_SHOWN = 80  # characters of an unknown voice name quoted in a message or the log
_MAX_REPORTED = 1024  # unknown names remembered so that each is logged once (oldest forgotten first)
_reported_fallbacks: OrderedDict[str, None] = OrderedDict()


def _report_fallback(voice: str, default: str) -> None:
    if voice in _reported_fallbacks:
        _reported_fallbacks.move_to_end(voice)
        return
    _reported_fallbacks[voice] = None
    if len(_reported_fallbacks) > _MAX_REPORTED:
        _reported_fallbacks.popitem(last=False)
    log.warning("unknown voice %r: speaking in the default voice %r (api.unknown_voice: strict refuses it)",
                voice[:_MAX_VOICE_SHOWN], default)  # fmt: skip


def check_text(services: Services, text: str, *, param: str = "text") -> str:
    """The text every speech endpoint speaks: not empty, within ``api.max_text_chars``, encodable as
    UTF-8 (no lone surrogate) and with something to say (a letter or digit outside emoji); else 400."""
    limit, source = text_limit(services)
    if not text.strip():
        raise ApiError(400, f"{param} is empty", code="empty_text", param=param)
    if len(text) > limit:
        raise ApiError(
            400,
            f"{param} has {len(text)} characters; the limit is {limit} ({source})",
            code="text_too_long",
            param=param,
        )
    bad = lone_surrogate_at(text)
    if bad is not None:
        raise ApiError(
            400,
            f"{param} is not valid Unicode: lone surrogate U+{ord(text[bad]):04X} at position {bad}",
            code="invalid_text",
            param=param,
        )
    if not has_speech(text):
        raise ApiError(
            400,
            f"{param} has nothing to speak: no letter or digit, only punctuation, symbols or emoji",
            code="nothing_to_speak",
            param=param,
        )
    return text


def text_limit(services: Services) -> tuple[int, str]:
    """The longest text a speech endpoint takes and where that number comes from: ``api.max_text_chars``,
    or the engine's own limit (its backend's, announced by its workers) where that is lower."""
    limit = services.config.api.max_text_chars
    engine_limit = getattr(services.engine, "max_text_chars", None)
    if isinstance(engine_limit, int) and engine_limit < limit:
        return engine_limit, f"the {services.engine.backend_name} engine's limit"
    return limit, "api.max_text_chars"


def check_sample_rate(services: Services, sample_rate: int | None, *, param: str = "sample_rate") -> int:
    if sample_rate is None:
        return services.config.api.default_sample_rate
    if sample_rate not in OUTPUT_RATES:
        rates = ", ".join(map(str, OUTPUT_RATES))
        raise ApiError(400, f"unsupported sample_rate {sample_rate}; use one of {rates}",
                       code="unsupported_sample_rate", param=param)  # fmt: skip
    return sample_rate


def check_audio_format(fmt: str, sample_rate: int, *, allowed: tuple[str, ...] | None = None,
                       param: str = "format") -> None:  # fmt: skip
    if allowed is not None and fmt not in allowed:
        raise ApiError(400, f"unsupported format {fmt!r} here; use one of {', '.join(allowed)}",
                       code="unsupported_format", param=param)  # fmt: skip
    try:
        check_format(fmt, sample_rate)
    except UnsupportedFormat as exc:
        raise ApiError(400, str(exc), code="unsupported_format", param=param) from exc


def check_voice_allowed(account: Account, voice: str, *, param: str = "voice") -> None:
    """403 unless the key may use ``voice`` (its ``voices`` list; empty: every voice)."""
    if not account.may_use_voice(voice):
        raise ApiError(403, f"key {account.name!r} may not use voice {voice!r}", code="voice_not_allowed",
                       param=param)  # fmt: skip


async def admit(services: Services, account: Account, served: Served | None, text: str) -> SpeechTicket:
    """The account's limits for a speech request of ``text`` (characters per minute, streams, quota),
    checked before any work starts: 429 past one. The ticket's stream slot is freed when its audio ends
    (``CountingStream``), the whole ticket when the answer is over (by the HTTP guard through ``served``,
    or by the caller)."""
    try:
        await services.usage.refresh_quota(account)
        ticket = services.limiter.admit_speech(account, len(text))
    except (RateLimited, StoreError) as exc:
        raise api_error(exc) from exc
    if served is not None:
        served.ticket, served.characters = ticket, len(text)
    return ticket


async def open_stream(
    services: Services,
    account: Account,
    served: Served | None,
    text: str,
    *,
    voice: str,
    output_rate: int,
    speed: float,
    instruct: str | None = None,
    paced: bool = True,
) -> SpeechStream:
    """``text`` from the audio cache or queued in the shared engine (in the account's priority class);
    engine errors become API errors. With ``served``, its audio is counted there."""
    try:
        stream, hit = await open_speech(services.engine, services.cache, services.voices, account, text,
                                        voice=voice, output_rate=output_rate, speed=speed,
                                        instruct=instruct or None, paced=paced)  # fmt: skip
    except (EngineError, ValueError) as exc:
        raise api_error(exc) from exc
    if served is None:
        return stream
    served.cache = None if hit is None else "hit" if hit else "miss"
    return CountingStream(stream, served)


def served_reporter(services: Services, *, limited: str | None = None) -> Callable[[Served], None]:
    """What meters a finished request: the usage meter (per key and day) and the metrics (per key)."""

    def report(served: Served) -> None:
        account = served.account
        first_byte = served.first_byte_s if served.speech else None
        services.usage.record(key_subject(account.name), errors=int(served.error), characters=served.characters,
                              audio_s=served.audio_s, first_byte_s=first_byte)  # fmt: skip
        services.metrics.observe_api(account.name, ok=not served.error, characters=served.characters,
                                     audio_s=served.audio_s, first_byte_s=first_byte, limited=limited)  # fmt: skip

    return report


def served_of(conn: HTTPConnection) -> Served | None:
    """The request as the HTTP guard meters it (None where no guard ran)."""
    served = conn.scope.get("state", {}).get("served")
    return served if isinstance(served, Served) else None


# -- waiting while watching the client -----------------------------------------------------------


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """``await work``, unless the client disconnects first: then ``work`` is cancelled and ClientGone raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone
    return task.result()


async def first_chunk(request: Request, stream: SpeechStream) -> np.ndarray | None:
    """The stream's first chunk (None: no audio), so errors before any audio still get a status code."""

    async def take() -> np.ndarray | None:
        async for chunk in stream:
            return chunk
        return None

    try:
        return await until_disconnect(request, take())
    except BaseException as exc:
        await stream.aclose()
        if isinstance(exc, EngineError):
            raise api_error(exc) from exc
        raise


async def collect_pcm(request: Request, stream: SpeechStream) -> np.ndarray:
    """All of the stream's audio as one int16 array."""

    async def take_all() -> np.ndarray:
        chunks = [chunk async for chunk in stream]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)

    try:
        return await until_disconnect(request, take_all())
    except EngineError as exc:
        raise api_error(exc) from exc
    finally:
        await stream.aclose()


async def chunks_from(stream: SpeechStream, first: np.ndarray | None) -> AsyncIterator[np.ndarray]:
    """``first`` (already taken by ``first_chunk``), then the rest of the stream."""
    if first is None:
        return
    yield first
    async for chunk in stream:
        yield chunk


async def encoded_body(
    stream: SpeechStream, first: np.ndarray | None, encoder: StreamingEncoder
) -> AsyncIterator[bytes]:
    """The stream's audio through ``encoder``: header, frames as they are ready, then the tail."""
    async for chunk in chunks_from(stream, first):
        data = encoder.encode(chunk)
        if data:
            yield data
    tail = encoder.finish()
    if tail:
        yield tail


def client_gone_response() -> Response:
    return Response(status_code=CLIENT_GONE_STATUS)


class EngineStreamingResponse(StreamingResponse):
    """A streamed body fed by an engine stream; the engine request is aborted however the response ends."""

    def __init__(
        self,
        content: AsyncIterator[bytes | str],
        *,
        stream: SpeechStream,
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._engine_stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except EngineError as exc:
            # Headers are out: the only way to tell the client is an incomplete body (no final chunk).
            log.warning("%s %s: stream failed mid-way: %s", scope.get("method"), scope.get("path"), exc)
            raise
        finally:
            await self._engine_stream.aclose()
            aclose: Any = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def audio_headers(
    sample_rate: int, extra: Mapping[str, str] | None = None, *, served: Served | None = None
) -> dict[str, str]:
    """Headers that tell raw-PCM clients what they get (harmless for containers); ``X-Cache: hit|miss``
    where the audio cache was asked."""
    cache = {"X-Cache": served.cache} if served is not None and served.cache else {}
    return {
        "X-Sample-Rate": str(sample_rate),
        "X-Channels": "1",
        "Cache-Control": "no-store",
        **cache,
        **(extra or {}),
    }
