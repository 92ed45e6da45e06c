"""The one UDP endpoint that carries every MQTT device's audio, inside the gateway's event loop.

Datagrams find their session by the ssrc in their header (random per session, from the nonce of
the server hello); each session's `UdpChannel` (gateway/transport/udp_channel.py) checks and opens
them. Accepted audio goes to the session's transport, which queues it for the session (a bounded
queue: a session that falls behind loses packets, counted, instead of memory). Downlink packets are
sealed by the channel and sent from this same socket, so they come from the address and port the
hello announced, which the device's connected UDP socket requires.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import Any

from gateway.config import UdpConfig
from gateway.transport.metrics import TransportMetrics
from gateway.transport.udp_channel import Accepted, Drop, UdpChannel
from gateway.xiaozhi import AudioOut
from gateway.xiaozhi.udp import UdpKeys, ssrc_of

log = logging.getLogger(__name__)

Sink = Callable[[Accepted], bool]  # takes an accepted packet; False: the session's queue is full


class UdpAudioServer(asyncio.DatagramProtocol):
    def __init__(self, config: UdpConfig, metrics: TransportMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self._channels: dict[int, tuple[UdpChannel, Sink]] = {}
        self._transport: asyncio.DatagramTransport | None = None
        self.port = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self, local_addr=(self.config.host, self.config.port)
        )
        self._transport = transport
        self.port = transport.get_extra_info("sockname")[1]
        log.info("UDP audio endpoint on %s:%d", self.config.host, self.port)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._channels.clear()

    @property
    def public_port(self) -> int:
        return self.config.public_port or self.port

    # ---- sessions ------------------------------------------------------------

    def open_channel(self, sink: Sink, *, frame_ms: int = 60) -> UdpChannel:
        """A new session's channel with fresh keys and an ssrc no live session has."""
        while True:
            ssrc = secrets.randbits(32)
            if ssrc not in self._channels:
                break
        channel = UdpChannel(
            UdpKeys.generate(ssrc),
            downlink_ssrc=secrets.randbits(32),
            frame_ms=frame_ms,
            max_payload=self.config.max_payload_bytes,
            sequence_window=self.config.sequence_window,
        )
        self._channels[ssrc] = (channel, sink)
        return channel

    def close_channel(self, channel: UdpChannel) -> None:
        entry = self._channels.get(channel.ssrc)
        if entry is not None and entry[0] is channel:
            del self._channels[channel.ssrc]

    def send(self, channel: UdpChannel, packet: AudioOut) -> None:
        if self._transport is None or channel.address is None:
            self.metrics.udp_unsent.inc()  # no uplink packet yet: the device's port is unknown
            if channel.sent_sequence == 0 and not channel.unsent_logged:
                channel.unsent_logged = True
                log.info("UDP session %08x: no packet from the device yet, so no address to send its audio to",
                         channel.ssrc)  # fmt: skip
            return
        self._transport.sendto(channel.seal(packet), channel.address)
        self.metrics.udp_sent.inc()

    # ---- datagrams -----------------------------------------------------------

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        ssrc = ssrc_of(data)
        entry = None if ssrc is None else self._channels.get(ssrc)
        if entry is None:
            self.metrics.udp_dropped.labels(Drop.MALFORMED if ssrc is None else Drop.UNKNOWN_SESSION).inc()
            return
        channel, sink = entry
        verdict = channel.receive(data, (addr[0], addr[1]))
        if isinstance(verdict, Drop):
            self.metrics.udp_dropped.labels(verdict).inc()
            return
        if verdict.moved_from is not None:
            self.metrics.udp_rebinds.inc()
            log.info("UDP session %08x moved to a new device address (NAT rebinding)", channel.ssrc)
        if not sink(verdict):
            self.metrics.udp_dropped.labels(Drop.QUEUE_FULL).inc()
            return
        self.metrics.udp_received.inc()

    def error_received(self, exc: Exception) -> None:
        log.debug("UDP audio endpoint: %s", exc)  # an ICMP error for a device that went away
