"""Voices at run time: list, add (clone from a prompt recording), remove; and one-off cloning.

Each ``/v1/voices`` route is also served under ``/v1/audio/voices``, where other CosyVoice3 servers have it.

- ``GET /v1/voices``: every voice the engine offers (built-in and presets), the default, the aliases.
- ``POST /v1/voices`` (multipart: ``name``, ``prompt_wav``, ``prompt_text``, optional ``instruct``,
  ``description``, ``overwrite``): the recording is checked, staged as ``voices/<name>.<hash>.wav``, its
  features prepared once by the engine (and cached on disk), then committed by writing
  ``voices/<name>.yaml``; the voice is usable at once by every endpoint and by device sessions, without a
  restart. An add that is refused or abandoned (the client goes away) is rolled back: the previous
  version, if any, stays on disk and in the engine (see voices/README.md).
- ``DELETE /v1/voices/{name}``: the engine stops offering it; its files and cached features go.
- ``POST /tts/zero_shot`` (multipart: ``text``, ``prompt_text``, ``prompt_wav``, optional ``format``
  pcm|wav, ``sample_rate``, ``speed``, ``instruct``): speak in a voice cloned for this request only,
  streamed like ``/tts`` (raw s16le mono by default).

Uploads may be WAV or anything FFmpeg decodes (converted to WAV before the store sees them); size and
length limits are ``api.max_prompt_bytes`` and ``api.max_prompt_seconds``. Malformed audio of any kind is
a 400 naming ``prompt_wav``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, Request, Response, UploadFile
from fastapi.responses import JSONResponse

from audio_codecs.errors import AudioCodecError
from audio_codecs.formats import StreamingEncoder, decode_audio
from audio_codecs.wav import float_to_int16, wav_bytes
from gateway.api.auth import current_account, require_api_key
from gateway.api.errors import ApiError, api_error
from gateway.api.forms import UploadRoute
from gateway.api.synthesis import (
    ClientGone,
    EngineStreamingResponse,
    admit,
    audio_headers,
    check_audio_format,
    check_sample_rate,
    check_text,
    client_gone_response,
    encoded_body,
    first_chunk,
    served_of,
    services_of,
    text_limit,
    until_disconnect,
)
from gateway.service.served import CountingStream
from gateway.service.speech import open_zero_shot
from gateway.services import Services
from gateway.voices.store import StagedVoice, VoiceExists, VoiceStore
from tts_engine.engine import MAX_SPEED, MIN_SPEED
from tts_engine.errors import EngineError
from tts_engine.voices import VoicePreset, check_voice_name

log = logging.getLogger(__name__)

router = APIRouter(route_class=UploadRoute, dependencies=[Depends(require_api_key)], tags=["voices"])


# /v1/audio/voices: the same routes where the CosyVoice3 servers users compare us with serve them
@router.get("/v1/voices")
@router.get("/v1/audio/voices")
async def list_voices(request: Request) -> JSONResponse:
    services = services_of(request)
    engine = services.engine
    store = getattr(services, "voices", None)
    if store is not None:
        await asyncio.to_thread(store.refresh)  # another gateway on the same folder may have changed it
    presets = store.names() if store is not None else []
    names = list(engine.voices) + [n for n in presets if n not in engine.voices]
    account = current_account(request)
    data = [_describe(services, name) for name in names if account.may_use_voice(name)]
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "default": engine.default_voice,
            "supports_cloning": engine.supports_cloning,
            "aliases": {k: v or engine.default_voice for k, v in services.config.api.voice_aliases.items()},
        }
    )


@router.post("/v1/voices", status_code=201)
@router.post("/v1/audio/voices", status_code=201)
async def add_voice(
    request: Request,
    name: Annotated[str, Form(description="[A-Za-z0-9_-]{1,64}")],
    prompt_wav: Annotated[UploadFile, File(description="the voice's recording: 1..30 s, >= 16 kHz")],
    prompt_text: Annotated[str, Form(description="the transcript of prompt_wav")],
    instruct: Annotated[str | None, Form()] = None,
    description: Annotated[str, Form()] = "",
    overwrite: Annotated[bool, Form()] = False,
) -> Response:
    """Clone a voice from a recording and its transcript; saved under voices/, usable at once."""
    services = services_of(request)
    engine = services.engine
    store = _store(services)
    _require_cloning(services)
    _check_transcript(services, prompt_text)
    try:
        check_voice_name(name)
    except EngineError as exc:
        raise ApiError(400, str(exc), code="invalid_voice_name", param="name") from exc
    _require_voice_admin(request, name)
    wav = await read_prompt_upload(services, prompt_wav)
    async with _voice_lock(request):  # one change of the voice set at a time
        await asyncio.to_thread(store.refresh)
        if name in engine.voices and name not in store:
            raise ApiError(409, f"{name!r} is a built-in voice of the {engine.backend_name} backend",
                           code="voice_exists", param="name")  # fmt: skip
        if name in store and not overwrite:
            raise ApiError(409, f"voice {name!r} already exists (send overwrite=true to replace it)",
                           code="voice_exists", param="name")  # fmt: skip
        try:
            staged = await asyncio.to_thread(
                store.stage, name, wav, prompt_text, instruct=instruct or None, description=description,
                overwrite=overwrite,
            )  # fmt: skip
        except VoiceExists as exc:
            raise ApiError(409, str(exc), code="voice_exists", param="name") from exc
        except EngineError as exc:
            raise api_error(exc) from exc
        # Prepared and committed, or rolled back, as one unit that cancelling this request cannot split.
        unit = asyncio.ensure_future(_prepare_and_commit(request, services, staged))
        try:
            preset = await asyncio.shield(unit)
        except ClientGone:
            return client_gone_response()
        except asyncio.CancelledError:
            await asyncio.wait({unit})  # keep the voice lock until the unit is done
            raise
    log.info("voice %r added (%s)", name, preset.prompt_wav)
    await _voice_changed(services, name)
    return JSONResponse(_describe(services, name), status_code=201)


@router.delete("/v1/voices/{name}", status_code=204, response_class=Response)
@router.delete("/v1/audio/voices/{name}", status_code=204, response_class=Response)
async def delete_voice(request: Request, name: str) -> Response:
    services = services_of(request)
    engine = services.engine
    store = _store(services)
    _require_voice_admin(request, name)
    await asyncio.to_thread(store.refresh)
    if name not in store:
        if name in engine.voices:
            raise ApiError(409, f"{name!r} is a built-in voice of the {engine.backend_name} backend and "
                           "cannot be removed", code="builtin_voice", param="name")  # fmt: skip
        raise ApiError(404, f"no voice {name!r}", code="unknown_voice", param="name")
    if name in (engine.default_voice, services.config.tts.voice):
        raise ApiError(409, f"{name!r} is the default voice (tts.voice) and cannot be removed",
                       code="default_voice", param="name")  # fmt: skip
    async with _voice_lock(request):
        if name in engine.voices:
            try:
                await engine.remove_voice(name)
            except EngineError as exc:
                raise api_error(exc) from exc
        if name in store:
            await asyncio.to_thread(store.remove, name)
    log.info("voice %r removed", name)
    await _voice_changed(services, name)
    return Response(status_code=204)


@router.post("/tts/zero_shot", response_class=Response)
async def zero_shot(
    request: Request,
    text: Annotated[str, Form()],
    prompt_wav: Annotated[UploadFile, File(description="1..30 s, >= 16 kHz")],
    prompt_text: Annotated[str, Form(description="the transcript of prompt_wav")],
    format: Annotated[str, Form(description="pcm (raw s16le mono) or wav")] = "pcm",
    sample_rate: Annotated[int | None, Form()] = None,
    speed: Annotated[float, Form(ge=MIN_SPEED, le=MAX_SPEED)] = 1.0,
    instruct: Annotated[str | None, Form()] = None,
) -> Response:
    """Speak ``text`` in a voice cloned from ``prompt_wav`` for this request only (nothing is saved)."""
    services = services_of(request)
    _require_cloning(services)
    check_text(services, text)
    _check_transcript(services, prompt_text)
    rate = check_sample_rate(services, sample_rate)
    check_audio_format(format, rate, allowed=("pcm", "wav"))
    wav = await read_prompt_upload(services, prompt_wav)
    account, served = current_account(request), served_of(request)
    await admit(services, account, served, text)
    try:
        stream, hit = await open_zero_shot(services.engine, services.cache, account, text, prompt_wav=wav,
                                           prompt_text=prompt_text, output_rate=rate, speed=speed,
                                           instruct=instruct or None)  # fmt: skip
    except (EngineError, ValueError) as exc:
        raise api_error(exc) from exc
    if served is not None:
        served.cache = None if hit is None else "hit" if hit else "miss"
        stream = CountingStream(stream, served)
    try:
        first = await first_chunk(request, stream)
    except ClientGone:
        return client_gone_response()
    encoder = StreamingEncoder(format, rate)
    return EngineStreamingResponse(encoded_body(stream, first, encoder), stream=stream,
                                   media_type=encoder.content_type,
                                   headers=audio_headers(rate, served=served))  # fmt: skip


# -- helpers --------------------------------------------------------------------------------------


async def _prepare_and_commit(request: Request, services: Services, staged: StagedVoice) -> VoicePreset:
    """Prepare a staged voice in the engine, then commit it to the store.

    When the engine refuses it, the client goes away or the commit fails, both are rolled back: the
    staged recording is deleted and the engine offers the previous version again (or no such voice), so
    an add that was not answered 201 leaves nothing behind, now or after a restart.
    """
    engine, store = services.engine, _store(services)
    name = staged.preset.name
    previous = store.get(name) if name in store else None
    preparing = asyncio.ensure_future(engine.add_voice(staged.preset))
    try:
        await until_disconnect(request, asyncio.shield(preparing))
        return await asyncio.to_thread(store.commit, staged)
    except (Exception, asyncio.CancelledError) as exc:
        await asyncio.gather(preparing, return_exceptions=True)  # the engine call runs to its end anyway
        log.warning("voice %r was not added (%s); rolling back", name, type(exc).__name__)
        await asyncio.to_thread(store.discard, staged)
        prepared = preparing.done() and not preparing.cancelled() and preparing.exception() is None
        if prepared:
            await _restore_engine_voice(services, name, previous)
        if isinstance(exc, ClientGone | asyncio.CancelledError):
            raise
        if not prepared:
            log.warning("voice %r could not be prepared: %s", name, exc)
        raise api_error(exc) from exc


async def _restore_engine_voice(services: Services, name: str, previous: VoicePreset | None) -> None:
    """Undo an ``engine.add_voice()``: offer the previous version again, or drop the name."""
    engine = services.engine
    try:
        if previous is not None:
            await engine.add_voice(previous)
        elif name in engine.voices:
            await engine.remove_voice(name)
    except Exception:
        log.exception("voice %r: restoring the engine's previous version failed", name)


async def read_prompt_upload(services: Services, upload: UploadFile) -> bytes:
    """The upload as WAV bytes, within ``api.max_prompt_bytes`` (413) and ``api.max_prompt_seconds`` (400)."""
    limit = services.config.api.max_prompt_bytes
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise _too_large(len(data), services)
    if not data:
        raise ApiError(400, "prompt_wav is empty", code="invalid_prompt", param="prompt_wav")
    max_seconds = services.config.api.max_prompt_seconds
    try:
        samples, rate = await asyncio.to_thread(decode_audio, data, max_seconds=max_seconds)
    except (AudioCodecError, ValueError) as exc:
        raise ApiError(400, f"prompt_wav is not readable audio: {exc}", code="invalid_prompt",
                       param="prompt_wav") from exc  # fmt: skip
    seconds = samples.size / rate if rate else 0.0
    if seconds > max_seconds:
        raise ApiError(400, f"prompt_wav is {seconds:.1f} s long; the limit is {max_seconds:g} s "
                       "(api.max_prompt_seconds)", code="prompt_too_long", param="prompt_wav")  # fmt: skip
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return data
    return wav_bytes(float_to_int16(samples), rate)  # mp3, flac, ... -> WAV for the voice store


def _check_transcript(services: Services, prompt_text: str) -> None:
    if not prompt_text.strip():
        raise ApiError(400, "prompt_text (the transcript of prompt_wav) is empty", code="empty_prompt_text",
                       param="prompt_text")  # fmt: skip
    limit, source = text_limit(services)
    if len(prompt_text) > limit:
        raise ApiError(400, f"prompt_text has {len(prompt_text)} characters; the limit is {limit} ({source})",
                       code="text_too_long", param="prompt_text")  # fmt: skip


def _too_large(size: int, services: Services) -> ApiError:
    limit = services.config.api.max_prompt_bytes
    return ApiError(413, f"upload of {size} bytes; prompt_wav may be at most {limit} bytes (api.max_prompt_bytes)",
                    code="prompt_too_large", param="prompt_wav")  # fmt: skip


async def _voice_changed(services: Services, name: str) -> None:
    """A voice was added, replaced or removed: the audio cache drops what it holds in it, and the fixed
    phrases are made again when they are spoken in it (the old audio plays until the new is ready)."""
    if services.cache is not None:
        await services.cache.invalidate_voice(name)
    if services.phrases is not None:
        services.phrases.voice_changed(services.engine, name)


def _require_voice_admin(request: Request, name: str) -> None:
    """403 unless the request's key may add, replace and remove voice ``name`` (``add_voices``)."""
    account = current_account(request)
    if not account.may_add_voice(name):
        raise ApiError(403, f"key {account.name!r} may not add, replace or remove voice {name!r}",
                       code="voice_not_allowed", param="name")  # fmt: skip


def _voice_lock(request: Request) -> asyncio.Lock:
    lock = getattr(request.app.state, "voice_lock", None)
    if lock is None:
        lock = request.app.state.voice_lock = asyncio.Lock()
    return lock


def _store(services: Services) -> VoiceStore:
    store = getattr(services, "voices", None)
    if store is None:
        raise ApiError(501, "this gateway has no voice store", code="no_voice_store")
    return store


def _require_cloning(services: Services) -> None:
    engine = services.engine
    if not engine.supports_cloning:
        raise ApiError(501, f"the {engine.backend_name} backend cannot clone voices (use cosyvoice)",
                       code="cloning_unsupported")  # fmt: skip


def _describe(services: Services, name: str) -> dict[str, Any]:
    engine = services.engine
    store = getattr(services, "voices", None)
    preset: VoicePreset | None = store.get(name) if store is not None and name in store else None
    return {
        "id": name,
        "name": name,
        "object": "voice",
        "source": "preset" if preset is not None else "builtin",
        "loaded": name in engine.voices,
        "default": name == engine.default_voice,
        "prompt_text": preset.prompt_text if preset else None,
        "instruct": preset.instruct if preset else None,
        "description": preset.description if preset else "",
    }
