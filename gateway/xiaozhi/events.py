"""Typed Xiaozhi protocol messages.

Each message is a frozen, slotted, keyword-only dataclass that validates its fields on
construction and raises :class:`LocalProtocolError` if they are wrong, so an invalid event cannot
exist. (When the codec builds an event from the peer's data it turns that error into a
:class:`RemoteProtocolError`.)

Direction (see docs/xiaozhi-protocol.md section 4.1):

* device -> server: :class:`Hello`, :class:`Listen`, :class:`Abort`, :class:`AudioIn`
* server -> device: :class:`ServerHello`, :class:`TtsStart`, :class:`TtsSentenceStart`,
  :class:`TtsSentenceEnd`, :class:`TtsStop`, :class:`Stt`, :class:`LlmEmotion`, :class:`Alert`,
  :class:`SystemCommand`, :class:`AudioOut`
* both: :class:`McpMessage`, :class:`Iot` (legacy), :class:`Goodbye` (MQTT only),
  :class:`UnknownMessage`
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .emotions import EMOTIONS
from .errors import LocalProtocolError

_U32_MAX = 2**32 - 1

# Rates and durations the firmware's downlink Opus decoder supports (section 3.2).
SERVER_SAMPLE_RATES = frozenset({8000, 12000, 16000, 24000, 48000})
SERVER_FRAME_DURATIONS = frozenset({5, 10, 20, 40, 60, 80, 100, 120})


def _fail(cls: type, message: str) -> LocalProtocolError:
    return LocalProtocolError(f"{cls.__name__}: {message}")


def _check_str(obj: object, name: str, *, optional: bool = False) -> None:
    value = getattr(obj, name)
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise _fail(type(obj), f"{name} must be a string, got {type(value).__name__}")


def _check_int(obj: object, name: str, *, minimum: int = 0, maximum: int | None = None) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(type(obj), f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        raise _fail(type(obj), f"{name}={value} is out of range")


def _check_dict(obj: object, name: str) -> None:
    value = getattr(obj, name)
    if not isinstance(value, dict):
        raise _fail(type(obj), f"{name} must be a JSON object (dict), got {type(value).__name__}")


def _check_bytes(obj: object, name: str) -> None:
    value = getattr(obj, name)
    if not isinstance(value, bytes):
        raise _fail(type(obj), f"{name} must be bytes, got {type(value).__name__}")


def _check_raw(obj: object) -> None:
    _check_dict(obj, "raw")
    reserved = {"type", "session_id"} & obj.raw.keys()  # type: ignore[attr-defined]
    if reserved:
        raise _fail(type(obj), f"raw must not contain {sorted(reserved)}; the codec adds them")


class ListenState(StrEnum):
    START = "start"
    STOP = "stop"
    DETECT = "detect"


class ListenMode(StrEnum):
    AUTO = "auto"
    MANUAL = "manual"
    REALTIME = "realtime"


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioParams:
    """Opus stream parameters announced in a hello (either direction)."""

    format: str = "opus"
    sample_rate: int = 16000
    channels: int = 1
    frame_duration: int = 60

    def __post_init__(self) -> None:
        _check_str(self, "format")
        _check_int(self, "sample_rate", minimum=1)
        _check_int(self, "channels", minimum=1)
        _check_int(self, "frame_duration", minimum=1)


# --- device -> server ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """The device's first text frame. ``version`` is the binary framing version it uses."""

    version: int = 1
    transport: str = "websocket"
    features: dict[str, Any] = field(default_factory=dict)
    audio_params: AudioParams | None = None

    def __post_init__(self) -> None:
        _check_int(self, "version")
        _check_str(self, "transport")
        _check_dict(self, "features")
        if self.audio_params is not None and not isinstance(self.audio_params, AudioParams):
            raise _fail(Hello, "audio_params must be an AudioParams or None")


@dataclass(frozen=True, slots=True, kw_only=True)
class Listen:
    """``listen`` start/stop/detect. ``text`` is the wake word or typed text of a detect."""

    state: ListenState
    mode: ListenMode | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.state, ListenState):
            raise _fail(Listen, f"state must be a ListenState, got {self.state!r}")
        if self.mode is not None and not isinstance(self.mode, ListenMode):
            raise _fail(Listen, f"mode must be a ListenMode or None, got {self.mode!r}")
        _check_str(self, "text", optional=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Abort:
    """Stop the current speech. ``reason`` is ``"wake_word_detected"`` or absent."""

    reason: str | None = None

    def __post_init__(self) -> None:
        _check_str(self, "reason", optional=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioIn:
    """One uplink Opus packet (device -> server). ``timestamp_ms`` is only carried by v2 framing."""

    opus: bytes
    timestamp_ms: int = 0

    def __post_init__(self) -> None:
        _check_bytes(self, "opus")
        _check_int(self, "timestamp_ms", maximum=_U32_MAX)


# --- both directions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class McpMessage:
    """An MCP JSON-RPC 2.0 message; ``payload`` is the JSON-RPC object."""

    payload: dict[str, Any]

    def __post_init__(self) -> None:
        _check_dict(self, "payload")


@dataclass(frozen=True, slots=True, kw_only=True)
class Iot:
    """Legacy ``iot`` message (firmware < 1.8.0). ``raw`` is every field except type and session_id."""

    raw: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_raw(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodbye:
    """``goodbye``: MQTT transport only; never sent on WebSocket by firmware or incumbent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownMessage:
    """A text message whose type is not known for this direction; to be ignored.

    ``raw`` is every field except ``type`` and ``session_id``.
    """

    type: str
    raw: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_str(self, "type")
        _check_raw(self)


# --- server -> device ------------------------------------------------------------------------


TRANSPORTS = frozenset({"websocket", "udp"})
"""The hello's ``transport``: the WebSocket, or MQTT for messages with UDP for audio (docs/mqtt-udp.md)."""

_HEX16 = re.compile(r"[0-9a-fA-F]{32}")


@dataclass(frozen=True, slots=True, kw_only=True)
class UdpParams:
    """Where and how a device sends its UDP audio (the MQTT server hello's ``udp`` object).

    ``key`` and ``nonce`` are hex of exactly 16 bytes (the firmware ignores the hello otherwise); the
    nonce is the 16-byte packet header the device starts from, so its first byte must be 0x01.
    """

    server: str
    port: int
    key: str
    nonce: str

    def __post_init__(self) -> None:
        _check_str(self, "server")
        if not self.server:
            raise _fail(UdpParams, "server must not be empty")
        _check_int(self, "port", minimum=1, maximum=65535)
        for name in ("key", "nonce"):
            _check_str(self, name)
            if not _HEX16.fullmatch(getattr(self, name)):
                raise _fail(UdpParams, f"{name} must be 32 hex digits (16 bytes)")
        if self.nonce[:2] != "01":
            raise _fail(UdpParams, "nonce must start with 01 (the audio packet type)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerHello:
    """The server's hello. ``audio_params`` must describe the downlink stream actually sent.

    ``transport`` is ``"websocket"``, or ``"udp"`` with ``udp`` (MQTT devices, docs/mqtt-udp.md).
    """

    session_id: str
    audio_params: AudioParams = field(default_factory=lambda: AudioParams(sample_rate=24000))
    transport: str = "websocket"
    udp: UdpParams | None = None

    def __post_init__(self) -> None:
        _check_str(self, "session_id")
        if self.transport not in TRANSPORTS:
            raise _fail(ServerHello, f"transport must be one of {sorted(TRANSPORTS)}, got {self.transport!r}")
        if (self.transport == "udp") != isinstance(self.udp, UdpParams):
            raise _fail(ServerHello, "a udp hello needs its udp parameters, and only a udp hello has them")
        if not isinstance(self.audio_params, AudioParams):
            raise _fail(ServerHello, "audio_params must be an AudioParams")
        if self.audio_params.sample_rate not in SERVER_SAMPLE_RATES:
            raise _fail(ServerHello, f"the device cannot decode sample_rate={self.audio_params.sample_rate}")
        if self.audio_params.frame_duration not in SERVER_FRAME_DURATIONS:
            raise _fail(
                ServerHello, f"the device cannot decode frame_duration={self.audio_params.frame_duration}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class TtsStart:
    """``tts start``: the device enters Speaking."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TtsSentenceStart:
    """``tts sentence_start``: subtitle for the audio that follows."""

    text: str

    def __post_init__(self) -> None:
        _check_str(self, "text")


@dataclass(frozen=True, slots=True, kw_only=True)
class TtsSentenceEnd:
    """``tts sentence_end``: ignored by firmware; optional."""

    text: str

    def __post_init__(self) -> None:
        _check_str(self, "text")


@dataclass(frozen=True, slots=True, kw_only=True)
class TtsStop:
    """``tts stop``: ends the turn; the device leaves Speaking."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Stt:
    """``stt``: the recognised user text, shown on the device."""

    text: str

    def __post_init__(self) -> None:
        _check_str(self, "text")


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmEmotion:
    """``llm``: change the device's face. ``emotion`` must be one of the 21 firmware names."""

    emotion: str
    text: str = ""

    def __post_init__(self) -> None:
        _check_str(self, "emotion")
        _check_str(self, "text")
        if self.emotion not in EMOTIONS:
            raise _fail(LlmEmotion, f"unknown emotion {self.emotion!r}; send one of {sorted(EMOTIONS)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """``alert``: status line, chat line, emotion and a vibration sound."""

    status: str
    message: str
    emotion: str

    def __post_init__(self) -> None:
        _check_str(self, "status")
        _check_str(self, "message")
        _check_str(self, "emotion")


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemCommand:
    """``system``: the only command firmware knows is ``"reboot"``."""

    command: str

    def __post_init__(self) -> None:
        _check_str(self, "command")


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioOut:
    """One downlink Opus packet (server -> device). ``timestamp_ms`` is only carried by v2 framing."""

    opus: bytes
    timestamp_ms: int = 0

    def __post_init__(self) -> None:
        _check_bytes(self, "opus")
        _check_int(self, "timestamp_ms", maximum=_U32_MAX)


DeviceEvent = Hello | Listen | Abort | AudioIn
"""Events only a device sends."""

ServerEvent = (
    ServerHello
    | TtsStart
    | TtsSentenceStart
    | TtsSentenceEnd
    | TtsStop
    | Stt
    | LlmEmotion
    | Alert
    | SystemCommand
    | AudioOut
)
"""Events only a server sends."""

SharedEvent = McpMessage | Iot | Goodbye | UnknownMessage
"""Events either side may send."""

Event = DeviceEvent | ServerEvent | SharedEvent
"""Any Xiaozhi protocol event."""
