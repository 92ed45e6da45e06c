"""Sans-I/O codec for the Xiaozhi device WebSocket protocol (docs/xiaozhi-protocol.md).

No sockets and no asyncio here: :class:`XiaozhiConnection` turns received frames into typed events
and events into frames to send; the caller moves the bytes.
"""

from .connection import Role, XiaozhiConnection
from .emotions import DEFAULT_EMOTION, EMOTIONS, emotion_for_emoji, find_emotion, is_emotion
from .errors import CloseCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from .events import (
    Abort,
    Alert,
    AudioIn,
    AudioOut,
    AudioParams,
    DeviceEvent,
    Event,
    Goodbye,
    Hello,
    Iot,
    Listen,
    ListenMode,
    ListenState,
    LlmEmotion,
    McpMessage,
    ServerEvent,
    ServerHello,
    SharedEvent,
    Stt,
    SystemCommand,
    TtsSentenceEnd,
    TtsSentenceStart,
    TtsStart,
    TtsStop,
    UnknownMessage,
)
from .framing import BINARY_VERSIONS, header_size, pack_audio, unpack_audio
from .handshake import HandshakeInfo, parse_handshake

__all__ = [
    "Abort",
    "Alert",
    "AudioIn",
    "AudioOut",
    "AudioParams",
    "BINARY_VERSIONS",
    "CloseCode",
    "DEFAULT_EMOTION",
    "DeviceEvent",
    "EMOTIONS",
    "Event",
    "Goodbye",
    "HandshakeInfo",
    "Hello",
    "Iot",
    "Listen",
    "ListenMode",
    "ListenState",
    "LlmEmotion",
    "LocalProtocolError",
    "McpMessage",
    "ProtocolError",
    "RemoteProtocolError",
    "Role",
    "ServerEvent",
    "ServerHello",
    "SharedEvent",
    "Stt",
    "SystemCommand",
    "TtsSentenceEnd",
    "TtsSentenceStart",
    "TtsStart",
    "TtsStop",
    "UnknownMessage",
    "XiaozhiConnection",
    "emotion_for_emoji",
    "find_emotion",
    "header_size",
    "is_emotion",
    "pack_audio",
    "parse_handshake",
    "unpack_audio",
]
