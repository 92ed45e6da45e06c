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
import contextlib
import logging
import secrets
import socket
from collections.abc import Callable
from typing import Any

from gateway.config import UdpConfig
from gateway.transport.metrics import TransportMetrics
from gateway.transport.udp_channel import Accepted, Drop, UdpChannel
from gateway.xiaozhi import AudioOut
from gateway.xiaozhi.udp import UdpKeys, ssrc_of

log = logging.getLogger(__name__)

Sink = Callable[[Accepted], bool]  # takes an accepted packet; False: the session's queue is full


READS_PER_WAKEUP = 512  # datagrams drained per readiness event (then the loop's other work goes on)
RECEIVE_BUFFER_BYTES = 4 << 20  # asked of the kernel (it may grant less: net.core.rmem_max)


class UdpAudioServer:
    """The socket is ours, not an asyncio datagram transport: asyncio's transport reads one datagram per
    event-loop iteration, which at 100 devices streaming 16.7 packets per second each, on a loop that is
    also pacing their replies, falls behind until the kernel drops packets. Here every readiness event
    drains the socket (up to READS_PER_WAKEUP datagrams), and sends are plain non-blocking `sendto`s."""

    def __init__(self, config: UdpConfig, metrics: TransportMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self._channels: dict[int, tuple[UdpChannel, Sink]] = {}
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.config.host, self.config.port, type=socket.SOCK_DGRAM)
        family, kind, proto, _name, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
            sock.bind(address)
        except OSError:
            sock.close()
            raise
        self._sock, self._loop = sock, loop
        self.port = sock.getsockname()[1]
        loop.add_reader(sock.fileno(), self._read_ready)
        log.info("UDP audio endpoint on %s:%d", self.config.host, self.port)

    def close(self) -> None:
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        self._channels.clear()

    def _read_ready(self) -> None:
        sock = self._sock
        if sock is None:
            return
        for _ in range(READS_PER_WAKEUP):
            try:
                data, addr = sock.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # an ICMP error for a device that went away
                log.debug("UDP audio endpoint: %s", exc)
                return
            self.datagram_received(data, addr)

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
        if self._sock is None or channel.address is None:
            self.metrics.udp_unsent.inc()  # no uplink packet yet: the device's port is unknown
            if channel.sent_sequence == 0 and not channel.unsent_logged:
                channel.unsent_logged = True
                log.info("UDP session %08x: no packet from the device yet, so no address to send its audio to",
                         channel.ssrc)  # fmt: skip
            return
        try:
            self._sock.sendto(channel.seal(packet), channel.address)
        except (BlockingIOError, InterruptedError):  # the send buffer is full: a lost packet, as on the air
            self.metrics.udp_dropped_out.inc()
            return
        except OSError as exc:
            log.debug("UDP send to a device failed: %s", exc)
            self.metrics.udp_dropped_out.inc()
            return
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

