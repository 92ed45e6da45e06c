"""The Xiaozhi WebSocket protocol as a sans-I/O codec.

:class:`XiaozhiConnection` turns received WebSocket messages into events and events into messages
to send. It never touches a socket, a clock or an event loop: the caller owns I/O and timing.

The role decides which direction is parsed: a ``Role.SERVER`` connection parses device -> server
messages and sends server -> device ones; a ``Role.DEVICE`` connection (device simulator, tests)
does the opposite. Received data that breaks the protocol raises :class:`RemoteProtocolError`;
any other exception from ``receive_*`` is a bug. Unknown message types are not errors: they come
back as :class:`UnknownMessage` for the caller to ignore.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from enum import Enum
from typing import Any

from .errors import CloseCode, LocalProtocolError, RemoteProtocolError
from .events import (
    TRANSPORTS,
    Abort,
    Alert,
    AudioIn,
    AudioOut,
    Event,
    Goodbye,
    Hello,
    Iot,
    Listen,
    LlmEmotion,
    McpMessage,
    ServerHello,
    Stt,
    SystemCommand,
    TtsSentenceEnd,
    TtsSentenceStart,
    TtsStart,
    TtsStop,
    UnknownMessage,
)
from .framing import header_size, pack_audio, unpack_audio
from .messages import (
    DEVICE_MESSAGE_TYPES,
    SERVER_MESSAGE_TYPES,
    message_json,
    parse_device_message,
    parse_server_message,
)


class Role(Enum):
    """Which end of the connection we are."""

    SERVER = "server"
    DEVICE = "device"


_SHARED = frozenset({McpMessage, Iot, Goodbye, UnknownMessage})
# Sending role -> event classes it may send.
_SENDABLE: dict[Role, frozenset[type]] = {
    Role.DEVICE: _SHARED | {Hello, Listen, Abort, AudioIn},
    Role.SERVER: _SHARED
    | {ServerHello, TtsStart, TtsSentenceStart, TtsSentenceEnd, TtsStop, Stt, LlmEmotion, Alert}
    | {SystemCommand, AudioOut},
}


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(msg: Any) -> Any:
    """Replaces lone surrogates (JSON `\\ud800` escapes) in every string of ``msg`` by U+FFFD.

    Such text cannot be encoded as UTF-8: echoing it in `stt`, or sending it on to an LLM,
    would fail. ``json.loads`` has already joined valid pairs, so any surrogate left is lone.
    Iterative, so its depth is bounded by what ``json.loads`` accepted, not by the stack.
    """

    def fix(value: Any) -> Any:
        return _SURROGATE.sub("\ufffd", value) if isinstance(value, str) else value

    root = [fix(msg)]
    stack: list[dict[str, Any] | list[Any]] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            items = [(fix(k), fix(v)) for k, v in node.items()]
            node.clear()
            node.update(items)
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        else:
            node[:] = [fix(v) for v in node]
            stack.extend(v for v in node if isinstance(v, dict | list))
    return root[0]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999 would parse as inf and could not be sent back as JSON
        raise ValueError(f"number {literal[:20]} is out of range")
    return value


class XiaozhiConnection:
    """One Xiaozhi WebSocket connection, seen from ``role``.

    ``binary_version`` (1, 2 or 3) is the audio framing from the ``Protocol-Version`` header; it
    cannot change during the connection. ``session_id`` goes into outgoing JSON messages: a server
    adds it when non-empty (and adopts the one of the :class:`ServerHello` it sends); a device
    adds it to every message but its hello, like the firmware, and learns it from the server hello.
    Limits on received frame sizes are checked before anything is parsed. ``transport`` is the
    hello's: ``"websocket"``, or ``"udp"`` for MQTT devices (their audio goes over UDP,
    gateway/xiaozhi/udp.py); a device-role connection refuses a server hello for the other one.
    """

    def __init__(
        self,
        role: Role,
        *,
        binary_version: int = 1,
        session_id: str = "",
        max_text_bytes: int = 64 * 1024,
        max_binary_bytes: int = 65535 + 16,
        transport: str = "websocket",
    ) -> None:
        if not isinstance(role, Role):
            raise LocalProtocolError(f"role must be a Role, got {role!r}")
        header_size(binary_version)  # validates the version
        for name, limit in (("max_text_bytes", max_text_bytes), ("max_binary_bytes", max_binary_bytes)):
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise LocalProtocolError(f"{name} must be a positive integer, got {limit!r}")
        if transport not in TRANSPORTS:
            raise LocalProtocolError(f"transport must be one of {sorted(TRANSPORTS)}, got {transport!r}")
        self._role = role
        self._transport = transport
        self._binary_version = binary_version
        self._max_text_bytes = max_text_bytes
        self._max_binary_bytes = max_binary_bytes
        self._sendable = _SENDABLE[role]
        self._parse: Callable[[dict[str, Any]], Event]
        if role is Role.SERVER:
            self._parse, self._peer_types = parse_device_message, SERVER_MESSAGE_TYPES
        else:
            self._parse, self._peer_types = parse_server_message, DEVICE_MESSAGE_TYPES
        self.session_id = session_id

    @property
    def role(self) -> Role:
        return self._role

    @property
    def transport(self) -> str:
        return self._transport

    @property
    def binary_version(self) -> int:
        return self._binary_version

    @property
    def session_id(self) -> str:
        return self._session_id

    @session_id.setter
    def session_id(self, value: str) -> None:
        if not isinstance(value, str):
            raise LocalProtocolError(f"session_id must be a string, got {type(value).__name__}")
        self._session_id = value

    # --- receiving ----------------------------------------------------------------------------

    def receive_text(self, text: str) -> Event:
        """Parse one received text frame (one JSON object) into an event for this role.

        Raises :class:`RemoteProtocolError` for oversize frames, invalid JSON, a non-object, a
        missing or non-string ``type`` and known messages with bad fields. Unknown types give
        :class:`UnknownMessage`. A device-role connection takes ``session_id`` from a server hello.
        """
        if not isinstance(text, str):
            raise LocalProtocolError(f"receive_text() takes str, got {type(text).__name__}")
        limit = self._max_text_bytes
        if len(text) > limit or (
            4 * len(text) > limit and len(text.encode("utf-8", "surrogatepass")) > limit
        ):
            raise RemoteProtocolError(
                f"text message exceeds {limit} bytes", close_code_hint=CloseCode.MESSAGE_TOO_BIG
            )
        try:
            msg = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        except (ValueError, RecursionError) as exc:
            raise RemoteProtocolError(
                f"text message is not valid JSON: {exc}", close_code_hint=CloseCode.INVALID_DATA
            ) from None
        if _SURROGATE_ESCAPE.search(text):
            msg = _without_lone_surrogates(msg)
        event = self._parse(msg)
        if isinstance(event, ServerHello) and event.transport != self._transport:
            # the firmware ignores a hello for another transport (and then times out)
            raise RemoteProtocolError(
                f"server hello for transport {event.transport!r} on a {self._transport!r} connection",
                close_code_hint=CloseCode.INVALID_DATA,
            )
        if isinstance(event, ServerHello) and isinstance(msg.get("session_id"), str):
            self._session_id = event.session_id  # as the firmware does; absent keeps the old one
        return event

    def receive_binary(self, data: bytes) -> AudioIn | AudioOut:
        """Strip the framing header from one received binary frame.

        A server-role connection returns :class:`AudioIn`, a device-role one :class:`AudioOut`.
        Oversize or truncated frames raise :class:`RemoteProtocolError`. An empty v1 frame gives
        an event with empty ``opus`` (DTX); callers skip those.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise LocalProtocolError(f"receive_binary() takes bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) > self._max_binary_bytes:
            raise RemoteProtocolError(
                f"binary message of {len(data)} bytes exceeds {self._max_binary_bytes}",
                close_code_hint=CloseCode.MESSAGE_TOO_BIG,
            )
        opus, timestamp_ms = unpack_audio(self._binary_version, data)
        if self._role is Role.SERVER:
            return AudioIn(opus=opus, timestamp_ms=timestamp_ms)
        return AudioOut(opus=opus, timestamp_ms=timestamp_ms)

    # --- sending ------------------------------------------------------------------------------

    def send(self, event: Event) -> str | bytes:
        """Encode an event: a JSON text frame (str) or a framed audio packet (bytes).

        Raises :class:`LocalProtocolError` for an event this role does not send, an
        :class:`UnknownMessage` whose type the peer knows, or a payload that is not JSON.
        """
        event_class = type(event)
        if event_class not in self._sendable:
            raise LocalProtocolError(f"a {self._role.value} does not send {event_class.__name__}")
        if isinstance(event, AudioIn | AudioOut):
            return pack_audio(self._binary_version, event.opus, event.timestamp_ms)
        if isinstance(event, UnknownMessage) and event.type in self._peer_types:
            raise LocalProtocolError(f"{event.type!r} is a known message type; send its event instead")
        body = message_json(event, binary_version=self._binary_version)
        if isinstance(event, ServerHello):
            self._session_id = event.session_id
        elif self._role is Role.DEVICE:
            if not isinstance(event, Hello):
                body = {"session_id": self._session_id, **body}
        elif self._session_id:
            body["session_id"] = self._session_id
        try:
            return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise LocalProtocolError(f"{event_class.__name__} cannot be encoded as JSON: {exc}") from None
