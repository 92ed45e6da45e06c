"""JSON text messages of the Xiaozhi protocol <-> events (docs/xiaozhi-protocol.md sections 3-4).

Parsing is lenient where the firmware or the incumbent is (missing optional fields, extra fields,
integral floats) and raises :class:`RemoteProtocolError` where a message cannot mean anything
(wrong field types, unknown ``listen``/``tts`` states, a server hello without
``transport`` "websocket" or "udp" with its ``udp`` object). Unknown message types become :class:`UnknownMessage`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import CloseCode, LocalProtocolError, RemoteProtocolError
from .events import (
    TRANSPORTS,
    Abort,
    Alert,
    AudioParams,
    Event,
    Goodbye,
    Hello,
    Iot,
    Listen,
    ListenMode,
    ListenState,
    LlmEmotion,
    McpMessage,
    ServerHello,
    Stt,
    SystemCommand,
    TtsSentenceEnd,
    TtsSentenceStart,
    TtsStart,
    TtsStop,
    UdpParams,
    UnknownMessage,
)

_MISSING: Any = object()
_ENVELOPE_KEYS = ("type", "session_id")


def _invalid(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(message, close_code_hint=CloseCode.INVALID_DATA)


class _Fields:
    """Typed access to the fields of one received JSON object. JSON null counts as absent."""

    __slots__ = ("_msg", "_type")

    def __init__(self, msg: dict[str, Any], msg_type: str) -> None:
        self._msg = msg
        self._type = msg_type

    def _absent(self, key: str, default: Any, expected: str) -> Any:
        if default is _MISSING:
            raise _invalid(f"{self._type!r} message lacks {expected} {key!r}")
        return default

    def text(self, key: str, default: Any = _MISSING) -> Any:
        value = self._msg.get(key)
        if value is None:
            return self._absent(key, default, "string")
        if not isinstance(value, str):
            raise _invalid(f"{self._type!r} message: {key!r} must be a string")
        return value

    def integer(self, key: str, default: Any = _MISSING) -> Any:
        value = self._msg.get(key)
        if value is None:
            return self._absent(key, default, "integer")
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(f"{self._type!r} message: {key!r} must be an integer")
        return value

    def obj(self, key: str, default: Any = _MISSING) -> Any:
        value = self._msg.get(key)
        if value is None:
            return self._absent(key, default, "object")
        if not isinstance(value, dict):
            raise _invalid(f"{self._type!r} message: {key!r} must be a JSON object")
        return value

    def rest(self) -> dict[str, Any]:
        return {key: value for key, value in self._msg.items() if key not in _ENVELOPE_KEYS}


# --- parsing: device -> server (read by a server) --------------------------------------------


def _audio_params(fields: _Fields, default: AudioParams) -> AudioParams | None:
    params = fields.obj("audio_params", None)
    if params is None:
        return None
    inner = _Fields(params, "audio_params")
    return AudioParams(
        format=inner.text("format", default.format),
        sample_rate=inner.integer("sample_rate", default.sample_rate),
        channels=inner.integer("channels", default.channels),
        frame_duration=inner.integer("frame_duration", default.frame_duration),
    )


def _parse_hello(fields: _Fields) -> Hello:
    return Hello(
        version=fields.integer("version", 1),
        transport=fields.text("transport", "websocket"),
        features=fields.obj("features", {}),
        audio_params=_audio_params(fields, AudioParams()),
    )


def _enum_value(enum: type[ListenState] | type[ListenMode], key: str, raw: str) -> Any:
    try:
        return enum(raw)
    except ValueError:
        raise _invalid(f"'listen' message: unknown {key} {raw[:40]!r}") from None


def _parse_listen(fields: _Fields) -> Listen:
    state = _enum_value(ListenState, "state", fields.text("state"))
    mode_raw = fields.text("mode", None)
    mode = None if mode_raw is None else _enum_value(ListenMode, "mode", mode_raw)
    text = fields.text("text", "" if state is ListenState.DETECT else None)
    return Listen(state=state, mode=mode, text=text)


def _parse_abort(fields: _Fields) -> Abort:
    return Abort(reason=fields.text("reason", None))


def _parse_mcp(fields: _Fields) -> McpMessage:
    return McpMessage(payload=fields.obj("payload"))


def _parse_iot(fields: _Fields) -> Iot:
    return Iot(raw=fields.rest())


def _parse_goodbye(fields: _Fields) -> Goodbye:
    return Goodbye()


# --- parsing: server -> device (read by a device) --------------------------------------------

# What the firmware assumes when the server hello omits audio_params (section 3.2).
_FIRMWARE_DOWNLINK_DEFAULT = AudioParams(sample_rate=24000, frame_duration=60)


def _parse_server_hello(fields: _Fields) -> ServerHello:
    transport = fields.text("transport", None)
    if transport not in TRANSPORTS:
        # The firmware ignores such a hello (and crashes its log line when transport is absent).
        raise _invalid(f"server hello must have transport 'websocket' or 'udp', got {transport!r}")
    params = _audio_params(fields, _FIRMWARE_DOWNLINK_DEFAULT)
    udp = None
    if transport == "udp":  # without a complete `udp` object the firmware ignores the hello
        inner = _Fields(fields.obj("udp"), "udp")
        udp = UdpParams(
            server=inner.text("server"), port=inner.integer("port"), key=inner.text("key"), nonce=inner.text("nonce")
        )
    return ServerHello(
        session_id=fields.text("session_id", ""),
        audio_params=params if params is not None else _FIRMWARE_DOWNLINK_DEFAULT,
        transport=transport,
        udp=udp,
    )


def _parse_tts(fields: _Fields) -> TtsStart | TtsSentenceStart | TtsSentenceEnd | TtsStop:
    state = fields.text("state")
    if state == "start":
        return TtsStart()
    if state == "stop":
        return TtsStop()
    if state == "sentence_start":
        return TtsSentenceStart(text=fields.text("text"))
    if state == "sentence_end":
        return TtsSentenceEnd(text=fields.text("text"))
    raise _invalid(f"'tts' message: unknown state {state[:40]!r}")


def _parse_stt(fields: _Fields) -> Stt:
    return Stt(text=fields.text("text"))


def _parse_llm(fields: _Fields) -> LlmEmotion:
    return LlmEmotion(emotion=fields.text("emotion"), text=fields.text("text", ""))


def _parse_alert(fields: _Fields) -> Alert:
    return Alert(status=fields.text("status"), message=fields.text("message"), emotion=fields.text("emotion"))


def _parse_system(fields: _Fields) -> SystemCommand:
    return SystemCommand(command=fields.text("command"))


_Parser = Callable[[_Fields], Event]

# Message type -> parser, per direction. Types not listed become UnknownMessage.
_DEVICE_PARSERS: dict[str, _Parser] = {
    "hello": _parse_hello,
    "listen": _parse_listen,
    "abort": _parse_abort,
    "mcp": _parse_mcp,
    "iot": _parse_iot,
    "goodbye": _parse_goodbye,
}
_SERVER_PARSERS: dict[str, _Parser] = {
    "hello": _parse_server_hello,
    "tts": _parse_tts,
    "stt": _parse_stt,
    "llm": _parse_llm,
    "alert": _parse_alert,
    "system": _parse_system,
    "mcp": _parse_mcp,
    "iot": _parse_iot,
    "goodbye": _parse_goodbye,
}

DEVICE_MESSAGE_TYPES = frozenset(_DEVICE_PARSERS)
"""Text message types a server understands from a device."""
SERVER_MESSAGE_TYPES = frozenset(_SERVER_PARSERS)
"""Text message types a device understands from a server."""


def parse_device_message(msg: dict[str, Any]) -> Event:
    """Turn a decoded device -> server JSON object into an event (raises RemoteProtocolError)."""
    return _parse(msg, _DEVICE_PARSERS)


def parse_server_message(msg: dict[str, Any]) -> Event:
    """Turn a decoded server -> device JSON object into an event (raises RemoteProtocolError)."""
    return _parse(msg, _SERVER_PARSERS)


def _parse(msg: dict[str, Any], parsers: dict[str, _Parser]) -> Event:
    if not isinstance(msg, dict):
        raise _invalid(f"text message must be a JSON object, got {type(msg).__name__}")
    msg_type = msg.get("type")
    if not isinstance(msg_type, str):
        raise _invalid("text message lacks a string 'type'")
    fields = _Fields(msg, msg_type)
    parser = parsers.get(msg_type)
    if parser is None:
        return UnknownMessage(type=msg_type, raw=fields.rest())
    try:
        return parser(fields)
    except LocalProtocolError as exc:  # an event rejected the peer's values
        raise _invalid(str(exc)) from None


# --- serialising -------------------------------------------------------------------------------


def _audio_params_json(params: AudioParams) -> dict[str, Any]:
    return {
        "format": params.format,
        "sample_rate": params.sample_rate,
        "channels": params.channels,
        "frame_duration": params.frame_duration,
    }


def _hello_json(event: Hello) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "hello", "version": event.version}
    if event.features:
        body["features"] = event.features
    body["transport"] = event.transport
    if event.audio_params is not None:
        body["audio_params"] = _audio_params_json(event.audio_params)
    return body


def _listen_json(event: Listen) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "listen", "state": event.state.value}
    if event.mode is not None:
        body["mode"] = event.mode.value
    if event.text is not None:
        body["text"] = event.text
    return body


def _abort_json(event: Abort) -> dict[str, Any]:
    return {"type": "abort"} if event.reason is None else {"type": "abort", "reason": event.reason}


# Event class -> JSON body without session_id.
_SERIALISERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    Hello: _hello_json,
    Listen: _listen_json,
    Abort: _abort_json,
    McpMessage: lambda e: {"type": "mcp", "payload": e.payload},
    Iot: lambda e: {"type": "iot", **e.raw},
    Goodbye: lambda e: {"type": "goodbye"},
    UnknownMessage: lambda e: {"type": e.type, **e.raw},
    TtsStart: lambda e: {"type": "tts", "state": "start"},
    TtsSentenceStart: lambda e: {"type": "tts", "state": "sentence_start", "text": e.text},
    TtsSentenceEnd: lambda e: {"type": "tts", "state": "sentence_end", "text": e.text},
    TtsStop: lambda e: {"type": "tts", "state": "stop"},
    Stt: lambda e: {"type": "stt", "text": e.text},
    LlmEmotion: lambda e: {"type": "llm", "text": e.text, "emotion": e.emotion},
    Alert: lambda e: {"type": "alert", "status": e.status, "message": e.message, "emotion": e.emotion},
    SystemCommand: lambda e: {"type": "system", "command": e.command},
}


def message_json(event: Event, *, binary_version: int) -> dict[str, Any]:
    """The JSON object for a text event, without ``session_id`` except in a server hello.

    A server hello always carries its ``transport`` (the firmware needs it; ``"udp"`` with the ``udp``
    object) and the connection's ``binary_version``. Raises :class:`LocalProtocolError` for audio events.
    """
    if isinstance(event, ServerHello):
        body = {
            "type": "hello",
            "version": binary_version,
            "transport": event.transport,
            "session_id": event.session_id,
            "audio_params": _audio_params_json(event.audio_params),
        }
        if event.udp is not None:
            udp = event.udp
            body["udp"] = {"server": udp.server, "port": udp.port, "key": udp.key, "nonce": udp.nonce}
        return body
    serialiser = _SERIALISERS.get(type(event))
    if serialiser is None:
        raise LocalProtocolError(f"{type(event).__name__} is not a text message")
    return serialiser(event)
