"""The engine worker's wire protocol: msgpack maps over a stream socket (docs/engine-workers.md).

Each frame is one msgpack map with a type key ``"t"``. msgpack objects delimit themselves, so frames
need no length prefix of our own: ``FrameReader`` feeds received bytes into msgpack's streaming
``Unpacker`` and yields every complete map. Its buffer is capped at ``MAX_FRAME_BYTES``, so an oversized
frame raises ``ProtocolError`` instead of growing memory; so does undecodable data or a frame that is
not a map with a string ``"t"``. After a ``ProtocolError`` from ``feed()`` the byte stream cannot be
resynchronised: the connection is closed. An unknown type or a bad field is answered with an
``error`` message and the connection stays up.

A worker started with a token (``--token-file`` or ``XZ_ENGINE_TOKEN``; for workers reached over TCP)
expects an ``auth`` frame with that token first and answers anything else, or nothing within
``AUTH_TIMEOUT_S``, with an ``unauthorized`` error before it closes; the hello (capabilities, voices)
comes only after it. Workers the gateway starts itself listen on unix sockets in a private directory.

The frames themselves are typed structs (tts_engine/worker/frames.py): ``encode()`` one, ``decode()``
a received map into one (a bad field is a ``FrameError``, answered as ``bad_argument``).

Errors travel typed (``kind``) and become the engine's own exceptions on the client side
(``error_to_exception``), so an API client sees the same 400/503 for a remote engine as for one in
process.
"""

from __future__ import annotations

from typing import Any

import msgpack

from tts_engine.errors import (
    EngineClosed,
    EngineError,
    EngineOverloaded,
    SynthesisFailed,
    UnknownVoice,
    WorkerLost,
)
from tts_engine.voices import VoiceError
from tts_engine.worker.frames import Error, decode, encode

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 32 * 1024 * 1024  # a voice upload's prompt wav (api.max_prompt_bytes <= 16 MiB) fits
MAX_AUTH_FRAME_BYTES = 4096
READ_SIZE = 64 * 1024

# error kinds
UNKNOWN_VOICE = "unknown_voice"
OVERLOADED = "overloaded"
BAD_ARGUMENT = "bad_argument"
SYNTHESIS_FAILED = "synthesis_failed"
VOICE_ERROR = "voice_error"
CLOSED = "closed"
PROTOCOL = "protocol"
UNAUTHORIZED = "unauthorized"

__all__ = ["FrameReader", "ProtocolError", "decode", "encode", "error_frame", "error_to_exception",
           "pack", "parse_address"]  # fmt: skip


class ProtocolError(Exception):
    """A frame that cannot be decoded, is too large, or is not a typed map."""


def pack(message: dict[str, Any]) -> bytes:
    """A raw map as a frame (tests and probes; the peers send typed frames with ``encode()``)."""
    return msgpack.packb(message, use_bin_type=True)


class FrameReader:
    """Received bytes in, complete messages out (msgpack's streaming ``Unpacker``, capped)."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max_frame_bytes, strict_map_key=True)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        try:
            self._unpacker.feed(data)
            messages = list(self._unpacker)
        except msgpack.BufferFull as exc:
            raise ProtocolError(f"frame larger than {MAX_FRAME_BYTES} bytes") from exc
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ProtocolError(f"undecodable frame: {exc!r}") from exc
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("t"), str):
                raise ProtocolError(f"a frame must be a map with a string 't', got {type(message).__name__}")
        return messages


def error_frame(exc: BaseException, *, id: str | None = None, call: int | None = None,
                in_flight: int | None = None) -> Error:  # fmt: skip
    """The ``error`` frame for an exception raised by the engine or by a bad argument."""
    ids: dict[str, Any] = {"id": id, "call": call, "in_flight": in_flight}
    if isinstance(exc, UnknownVoice):
        return Error(kind=UNKNOWN_VOICE, message=str(exc), voice=exc.voice, available=exc.available, **ids)
    if isinstance(exc, SynthesisFailed):
        # the cause's type travels too: a backend that refuses the caller's input (ValueError, VoiceError)
        # is the caller's fault (400), anything else the engine's (500), as in process (gateway/api/errors.py)
        return Error(kind=SYNTHESIS_FAILED, message=str(exc.cause), cause=_cause_kind(exc.cause), **ids)
    if isinstance(exc, EngineOverloaded):
        kind = OVERLOADED
    elif isinstance(exc, VoiceError):
        kind = VOICE_ERROR
    elif isinstance(exc, EngineClosed):
        kind = CLOSED
    elif isinstance(exc, ValueError | TypeError | KeyError):  # a FrameError is a ValueError
        kind = BAD_ARGUMENT
    elif isinstance(exc, ProtocolError):
        kind = PROTOCOL
    else:
        kind = SYNTHESIS_FAILED
    return Error(kind=kind, message=str(exc), **ids)


def _cause_kind(cause: BaseException) -> str:
    """What a failed request's cause was: the caller's input (``bad_argument``, ``voice_error``) or not."""
    if isinstance(cause, VoiceError):
        return VOICE_ERROR
    if isinstance(cause, ValueError | TypeError):
        return BAD_ARGUMENT
    return SYNTHESIS_FAILED


def error_to_exception(error: Error, req_id: str = "") -> BaseException:
    """The client side of ``error_frame``: the engine exception a local engine would have raised."""
    kind, text = error.kind, error.message
    if kind == UNKNOWN_VOICE:
        return UnknownVoice(error.voice or "", list(error.available or []))
    if kind == OVERLOADED:
        return EngineOverloaded(text)
    if kind == SYNTHESIS_FAILED:
        cause: BaseException = (
            ValueError(text) if error.cause == BAD_ARGUMENT
            else VoiceError(text) if error.cause == VOICE_ERROR
            else EngineError(text)
        )  # fmt: skip
        return SynthesisFailed(req_id, cause)
    if kind == VOICE_ERROR:
        return VoiceError(text)
    if kind == BAD_ARGUMENT:
        return ValueError(text)
    if kind == CLOSED:
        return WorkerLost(f"engine worker closed: {text}")
    if kind == UNAUTHORIZED:
        return WorkerLost(f"engine worker refused the connection: {text}")
    return EngineError(f"engine worker protocol error: {text}")


def parse_address(address: str) -> tuple[str, Any]:
    """``unix:PATH`` -> ("unix", PATH); ``tcp://HOST:PORT`` -> ("tcp", (HOST, PORT))."""
    if address.startswith("unix:"):
        path = address[len("unix:") :]
        if not path:
            raise ValueError("unix: address needs a path")
        return "unix", path
    if address.startswith("tcp://"):
        host, sep, port = address[len("tcp://") :].rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"tcp address must be tcp://HOST:PORT, got {address!r}")
        return "tcp", (host.strip("[]") or "127.0.0.1", int(port))
    raise ValueError(f"address must be unix:PATH or tcp://HOST:PORT, got {address!r}")
