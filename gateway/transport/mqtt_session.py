"""One MQTT device session's transport: JSON messages over the device's MQTT connection, Opus over UDP.

The session (gateway/device/session.py) reads one ordered inbox: the JSON text of each PUBLISH the
device sent on its topic (put there by the connection, gateway/transport/mqtt.py) and the uplink
audio the UDP endpoint accepted for this session's ssrc (with the losses before each packet). The
inbox is bounded: text waits for room (at most `transport.mqtt.write_timeout_s`), audio that finds
it full is dropped and counted. What the session sends goes back as PUBLISH packets pushed on the
same connection (the firmware never subscribes), and as UDP datagrams sealed by the session's channel.

Ending the session from our side (idle timeout, `end_conversation`, a replacement, shutdown) sends
`{"type":"goodbye","session_id":...}`, the MQTT way to close the audio channel; the MQTT connection
stays up for the next conversation. A goodbye from the device, its next hello, or the end of its
connection end the session without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Protocol

from gateway.transport.base import Received, UplinkLoss
from gateway.transport.udp_channel import Accepted, UdpChannel
from gateway.xiaozhi import AudioOut, UdpParams

if TYPE_CHECKING:
    from gateway.transport.metrics import TransportMetrics
    from gateway.transport.udp import UdpAudioServer

log = logging.getLogger(__name__)


class MessagePusher(Protocol):
    """The device's MQTT connection, as a session's transport uses it."""

    @property
    def alive(self) -> bool: ...

    async def push(self, text: str) -> None:
        """Publishes ``text`` to the device's connection (raises ConnectionError when it is gone)."""
        ...


class MqttUdpTransport:
    def __init__(
        self,
        connection: MessagePusher,
        udp: UdpAudioServer,
        metrics: TransportMetrics,
        *,
        udp_server: str,
        frame_ms: int,
        queue_size: int,
        conceal_max_frames: int,
        put_timeout_s: float,
    ) -> None:
        self._connection = connection
        self._udp = udp
        self._metrics = metrics
        self._udp_server = udp_server
        self._inbox: asyncio.Queue[Received] = asyncio.Queue(maxsize=queue_size)
        self._conceal_max = conceal_max_frames
        self._put_timeout_s = put_timeout_s
        self._ended = False
        self.goodbye_sent = False
        self.device_left = False  # the device ended the session itself (goodbye, new hello, disconnect)
        self.session_id = ""  # the session's, for the goodbye we may send
        self.channel: UdpChannel = udp.open_channel(self._deliver, frame_ms=frame_ms)

    # ---- what the connection and the UDP endpoint feed in ---------------------------------

    async def put_text(self, text: str) -> bool:
        """Queues one JSON message for the session; False when it was dropped (session ended or stuck)."""
        if self._ended:
            return False
        try:
            async with asyncio.timeout(self._put_timeout_s):
                await self._inbox.put(text)
        except TimeoutError:
            log.warning("MQTT session %s is not reading its messages; one dropped", self.session_id)
            return False
        return True

    def _deliver(self, accepted: Accepted) -> bool:
        if self._ended:
            return True  # nobody reads any more: not a queue overflow
        lost = accepted.lost
        concealed = min(lost, self._conceal_max)
        if self._inbox.qsize() + (2 if concealed else 1) > self._inbox.maxsize:
            return False
        if lost:
            self._metrics.udp_lost.inc(lost)
        if concealed:
            self._metrics.udp_concealed.inc(concealed)
            self._inbox.put_nowait(UplinkLoss(concealed))
        self._inbox.put_nowait(accepted.audio)
        return True

    def end(self, *, device_left: bool) -> None:
        """No more input for the session: its read loop ends at the next `receive`."""
        self.device_left = self.device_left or device_left
        self._ended = True
        with contextlib.suppress(asyncio.QueueFull):
            self._inbox.put_nowait(None)  # wakes a waiting reader; a full inbox wakes it anyway
        self._udp.close_channel(self.channel)

    # ---- DeviceTransport -----------------------------------------------------------------

    async def receive(self) -> Received:
        if self._ended:
            return None
        item = await self._inbox.get()
        return None if self._ended else item

    async def send_text(self, text: str) -> None:
        if self._ended and self.device_left:
            raise ConnectionError("the device ended this session")
        await self._connection.push(text)

    async def send_bytes(self, data: bytes) -> None:
        raise ConnectionError("audio goes over UDP on this transport (send_audio)")

    async def close(self, code: int = 1000) -> None:
        """Ends the session from our side: a goodbye with its session_id, unless the device left first."""
        if not self.device_left and not self.goodbye_sent and self._connection.alive and self.session_id:
            self.goodbye_sent = True
            goodbye = json.dumps({"session_id": self.session_id, "type": "goodbye"}, separators=(",", ":"))
            with contextlib.suppress(ConnectionError, OSError):
                await self._connection.push(goodbye)
        self.end(device_left=False)

    # ---- DatagramAudio -------------------------------------------------------------------

    def udp_params(self) -> UdpParams:
        return self.channel.params(self._udp_server, self._udp.public_port)

    def send_audio(self, packet: AudioOut) -> None:
        if not self._ended:
            self._udp.send(self.channel, packet)
