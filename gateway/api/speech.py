"""Speech over HTTP: whole files, chunked streams, OpenAI's ``/v1/audio/speech`` and the incumbent's ``/tts``.

- ``POST /v1/tts`` (and ``GET /v1/tts?text=...``): the whole file, WAV by default.
- ``POST /v1/tts/stream``: the file streamed as it is synthesised (WAV with a streaming header, raw PCM,
  or a compressed format); the first bytes leave as soon as the engine has the first chunk.
- ``POST /v1/audio/speech``: OpenAI-compatible. ``wav`` and ``flac`` come whole (clients such as the
  incumbent's pydub read the WAV data size literally; FLAC writes its length at the end), ``pcm``,
  ``mp3``, ``opus`` and ``aac`` are streamed; ``stream_format: sse`` sends ``speech.audio.delta`` events.
- ``POST /tts``: the incumbent's ``index_stream`` provider: ``{"text", "character"}`` in, chunked raw
  s16le mono 24 kHz out.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from audio_codecs.formats import AUDIO_FORMATS, CONTENT_TYPES, StreamingEncoder, encode_audio
from gateway.api.auth import current_account, require_api_key
from gateway.api.errors import ApiRoute
from gateway.api.synthesis import (
    ClientGone,
    EngineStreamingResponse,
    admit,
    audio_headers,
    check_audio_format,
    check_sample_rate,
    check_text,
    check_voice_allowed,
    choose_voice,
    chunks_from,
    client_gone_response,
    collect_pcm,
    encoded_body,
    first_chunk,
    open_stream,
    served_of,
    services_of,
)
from tts_engine import SpeechStream
from tts_engine.engine import MAX_SPEED, MIN_SPEED
from tts_engine.errors import EngineError

router = APIRouter(route_class=ApiRoute, dependencies=[Depends(require_api_key)], tags=["speech"])

INDEX_STREAM_RATE = 24000  # the incumbent's index_stream provider plays the body as 24 kHz s16le mono
_WHOLE_FILE_FORMATS = ("wav", "flac")  # /v1/audio/speech sends these complete, with exact lengths
_FORMAT_LIST = ", ".join(AUDIO_FORMATS)
_AUDIO_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {ctype: {} for ctype in CONTENT_TYPES.values()}, "description": "audio"},
    400: {"description": "bad request (text, voice, format, sample rate, speed)"},
    401: {"description": "missing or invalid API key"},
    403: {"description": "the key may not use this voice"},
    429: {"description": "over the key's limits (Retry-After, x-ratelimit-* headers)"},
    503: {"description": "engine busy or shutting down"},
}


class TtsRequest(BaseModel):
    text: str = Field(description="what to say")
    voice: str | None = Field(
        None, description="a voice name (GET /v1/voices) or alias; default voice if unset"
    )
    format: str = Field("wav", description=f"one of {_FORMAT_LIST}")
    sample_rate: int | None = Field(None, description="Hz; api.default_sample_rate if unset")
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    instruct: str | None = Field(None, description="style instruction (CosyVoice instruct mode)")


class VoiceId(BaseModel):
    id: str


class SpeechRequest(BaseModel):
    """OpenAI's ``audio.speech.create`` body; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field("tts-1", description="accepted and ignored: there is one engine")
    input: str
    voice: str | VoiceId | None = Field(
        None, description='a name (alloy... map to our default) or {"id": name}'
    )
    instructions: str | None = Field(None, description="CosyVoice instruct mode")
    response_format: str = Field("mp3", description=f"one of {_FORMAT_LIST}")
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    stream_format: Literal["audio", "sse"] = "audio"
    sample_rate: int | None = Field(None, description="extension: Hz, api.default_sample_rate if unset")


class IndexStreamRequest(BaseModel):
    """The incumbent's ``index_stream`` body."""

    model_config = ConfigDict(extra="ignore")

    text: str
    character: str | None = Field(None, description="the voice (the incumbent's `voice` key)")


@router.post("/v1/tts", responses=_AUDIO_RESPONSES, response_class=Response)
async def tts_file(request: Request, body: TtsRequest) -> Response:
    """Synthesise ``text`` and return the whole file (``audio/wav`` by default)."""
    stream, rate = await _prepare(
        request, body.text, body.voice, body.format, body.sample_rate, body.speed, body.instruct
    )
    return await _whole_file(request, stream, body.format, rate)


@router.get("/v1/tts", responses=_AUDIO_RESPONSES, response_class=Response)
async def tts_file_get(
    request: Request,
    text: Annotated[str, Query()],
    voice: Annotated[str | None, Query()] = None,
    format: Annotated[str, Query()] = "wav",
    sample_rate: Annotated[int | None, Query()] = None,
    speed: Annotated[float, Query(ge=MIN_SPEED, le=MAX_SPEED)] = 1.0,
    instruct: Annotated[str | None, Query()] = None,
) -> Response:
    """``POST /v1/tts`` as a query string, for clients that only GET (the incumbent's ``custom`` provider)."""
    stream, rate = await _prepare(request, text, voice, format, sample_rate, speed, instruct)
    return await _whole_file(request, stream, format, rate)


@router.post("/v1/tts/stream", responses=_AUDIO_RESPONSES, response_class=Response)
async def tts_stream(request: Request, body: TtsRequest) -> Response:
    """Stream the audio as it is synthesised: WAV with a streaming header (sizes 0xFFFFFFFF), raw PCM, ..."""
    stream, rate = await _prepare(
        request, body.text, body.voice, body.format, body.sample_rate, body.speed, body.instruct
    )
    return await _streamed(request, stream, StreamingEncoder(body.format, rate))


@router.post("/v1/audio/speech", responses=_AUDIO_RESPONSES, response_class=Response)
async def openai_speech(request: Request, body: SpeechRequest) -> Response:
    """OpenAI-compatible speech (``client.audio.speech.create``)."""
    fmt = body.response_format
    voice = body.voice.id if isinstance(body.voice, VoiceId) else body.voice
    stream, rate = await _prepare(request, body.input, voice, fmt, body.sample_rate, body.speed, body.instructions,
                            text_param="input", format_param="response_format")  # fmt: skip
    if body.stream_format == "audio" and fmt in _WHOLE_FILE_FORMATS:
        return await _whole_file(request, stream, fmt, rate)
    encoder = StreamingEncoder(fmt, rate)
    if body.stream_format == "audio":
        return await _streamed(request, stream, encoder)
    try:
        first = await first_chunk(request, stream)
    except ClientGone:
        return client_gone_response()
    return EngineStreamingResponse(
        _sse_events(stream, first, encoder, num_chars=len(body.input)),
        stream=stream,
        media_type="text/event-stream",
        headers=audio_headers(rate, {"X-Audio-Format": fmt}, served=served_of(request)),
    )


@router.post("/tts", responses=_AUDIO_RESPONSES, response_class=Response)
async def index_stream_tts(request: Request, body: IndexStreamRequest) -> Response:
    """The incumbent's ``index_stream`` provider: chunked raw s16le mono 24 kHz PCM, no header."""
    stream, rate = await _prepare(request, body.text, body.character, "pcm", INDEX_STREAM_RATE, 1.0, None,
                            voice_param="character")  # fmt: skip
    encoder = StreamingEncoder("pcm", rate)
    return await _streamed(request, stream, encoder, media_type="application/octet-stream")


# -- plumbing -------------------------------------------------------------------------------------


async def _prepare(
    request: Request,
    text: str,
    voice: str | None,
    fmt: str,
    sample_rate: int | None,
    speed: float,
    instruct: str | None,
    *,
    text_param: str = "text",
    voice_param: str = "voice",
    format_param: str = "format",
) -> tuple[SpeechStream, int]:
    """Check the request (400s name the offending field, 403 a voice the key may not use), then its key's
    limits (429), then open its audio: from the cache or queued in the engine. (stream, rate)."""
    services = services_of(request)
    rate = check_sample_rate(services, sample_rate)
    check_audio_format(fmt, rate, param=format_param)
    check_text(services, text, param=text_param)
    name = choose_voice(services, voice, param=voice_param, lenient=True)  # api.unknown_voice applies
    account, served = current_account(request), served_of(request)
    check_voice_allowed(account, name, param=voice_param)
    await admit(services, account, served, text)
    stream = await open_stream(services, account, served, text, voice=name, output_rate=rate, speed=speed,
                               instruct=instruct)  # fmt: skip
    return stream, rate


async def _whole_file(request: Request, stream: SpeechStream, fmt: str, sample_rate: int) -> Response:
    try:
        pcm = await collect_pcm(request, stream)
    except ClientGone:
        return client_gone_response()
    audio = await asyncio.to_thread(encode_audio, pcm, sample_rate, fmt)
    return Response(audio, media_type=CONTENT_TYPES[fmt], headers=audio_headers(sample_rate, served=served_of(request)))


async def _streamed(
    request: Request, stream: SpeechStream, encoder: StreamingEncoder, *, media_type: str | None = None
) -> Response:
    try:
        first = await first_chunk(request, stream)
    except ClientGone:
        return client_gone_response()
    return EngineStreamingResponse(
        encoded_body(stream, first, encoder),
        stream=stream,
        media_type=media_type or encoder.content_type,
        headers=audio_headers(encoder.sample_rate, served=served_of(request)),
    )


def _sse(event: dict[str, Any]) -> str:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


async def _sse_events(
    stream: SpeechStream, first: Any, encoder: StreamingEncoder, *, num_chars: int
) -> AsyncIterator[str]:
    """OpenAI's speech SSE: ``speech.audio.delta`` (base64 audio in the response format), then ``done``."""
    num_samples = 0
    try:
        async for chunk in chunks_from(stream, first):
            num_samples += chunk.size
            data = encoder.encode(chunk)
            if data:
                yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    except EngineError as exc:
        yield _sse(
            {"type": "error", "error": {"message": f"synthesis failed: {exc}", "type": "server_error"}}
        )
        return
    tail = encoder.finish()
    if tail:
        yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(tail).decode()})
    yield _sse(
        {
            "type": "speech.audio.done",
            "usage": {"input_tokens": num_chars, "output_tokens": 0, "total_tokens": num_chars},
            "duration_s": round(num_samples / encoder.sample_rate, 3),
        }
    )
