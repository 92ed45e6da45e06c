"""What a `Session` (gateway/device/session.py) needs of its device's connection, whatever carries it.

A transport delivers the device's messages in order and takes the session's: JSON text both ways;
audio as framed binary messages on the WebSocket (the session's codec frames it), or, on MQTT, as
encrypted UDP datagrams that the transport itself opens and seals (`DatagramAudio`). Hello, listen
modes, abort, MCP, goodbye, idle timeouts, tools, memory, AEC and metrics are the session's, the
same on every transport.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.xiaozhi import AudioIn, AudioOut, UdpParams


@dataclass(frozen=True, slots=True)
class UplinkLoss:
    """Uplink audio packets lost in transit (a UDP sequence gap) right before the packet that follows:
    the session hands them to the Opus decoder's packet-loss concealment."""

    packets: int


Received = str | bytes | AudioIn | UplinkLoss | None
"""One thing from the device: a JSON text message, a framed binary audio message (WebSocket), an
uplink packet already opened by the transport (UDP), a loss before the next one (UDP), or None: the
connection ended."""


class DeviceTransport(Protocol):
    async def receive(self) -> Received: ...
    async def send_text(self, text: str) -> None: ...
    async def send_bytes(self, data: bytes) -> None: ...
    async def close(self, code: int = 1000) -> None: ...


class DatagramAudio(Protocol):
    """A transport whose audio travels outside its message stream (MQTT + UDP, gateway/transport/mqtt_session.py)."""

    def udp_params(self) -> UdpParams:
        """The server hello's `udp` object: where the device sends its audio, with the session's key and nonce."""
        ...

    def send_audio(self, packet: AudioOut) -> None:
        """One downlink Opus packet, its timestamp the playback clock (sending a datagram never blocks)."""
        ...
