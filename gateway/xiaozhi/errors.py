"""Errors raised by the Xiaozhi protocol codec.

Exception tree::

    ProtocolError                 base class; carries ``close_code_hint``
    ├── LocalProtocolError        we misused the API (an invalid event, a wrong-direction send)
    └── RemoteProtocolError       the peer sent something we cannot accept

Any other exception escaping the codec is a bug in the codec.
"""

from __future__ import annotations

from enum import IntEnum


class CloseCode(IntEnum):
    """WebSocket close codes (RFC 6455 section 7.4.1) the codec suggests."""

    NORMAL_CLOSURE = 1000
    PROTOCOL_ERROR = 1002
    UNSUPPORTED_DATA = 1003
    INVALID_DATA = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011


class ProtocolError(Exception):
    """A message could not be encoded or decoded.

    ``close_code_hint`` is the WebSocket close code a caller that decides to close the
    connection should use; the codec itself never closes anything.
    """

    default_close_code: CloseCode = CloseCode.PROTOCOL_ERROR

    def __init__(self, message: str, *, close_code_hint: int | None = None) -> None:
        super().__init__(message)
        self.close_code_hint = int(
            close_code_hint if close_code_hint is not None else self.default_close_code
        )


class LocalProtocolError(ProtocolError):
    """Our own code asked for something the protocol does not allow."""

    default_close_code = CloseCode.INTERNAL_ERROR


class RemoteProtocolError(ProtocolError):
    """The peer sent a message that breaks the protocol."""

    default_close_code = CloseCode.PROTOCOL_ERROR
