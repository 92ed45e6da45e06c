"""Device simulators for the MQTT + UDP transport (docs/mqtt-udp.md); `device_sim.py --transport mqtt`.

- `MqttDeviceSimulator` behaves as the firmware's `MqttProtocol` does (main/protocols/mqtt_protocol.cc):
  it takes `mqtt` from OTA, connects with its client id, username and password, never subscribes,
  publishes its JSON to `publish_topic` at QoS 0 and handles every PUBLISH that arrives, whatever the
  topic. Its hello is `{"type":"hello","version":3,"transport":"udp",...}`; from the server's hello it
  takes the session id and `udp {server, port, key, nonce}`, opens a UDP socket connected to that
  address, and builds each uplink header from the nonce with only the length, timestamp and sequence
  overwritten (first sequence 1). Downlink packets shorter than 16 bytes, of another type, with a wrong
  length or an older sequence are dropped, as the firmware drops them. Its own MQTT client is written
  on amqtt's packet classes, like the server's listener.
- `SubscribingMqttDevice` is the py-xiaozhi client's way: paho-mqtt in its own network thread, a
  SUBSCRIBE to `subscribe_topic` after CONNACK, uplink headers that keep the nonce's timestamp.

`Impairment` drops and reorders datagrams in both directions (a weak Wi-Fi link), at the device's
socket, so the server sees exactly what a lossy network would give it (scripts/device_sim_udp.py, with the
silent microphone frame); the subscribing device's paho-mqtt client is scripts/device_sim_paho.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from gateway.transport import mqtt_codec as mq
from gateway.xiaozhi import (
    AudioIn,
    AudioOut,
    AudioParams,
    Goodbye,
    Hello,
    McpMessage,
    Role,
    ServerHello,
    XiaozhiConnection,
)
from gateway.xiaozhi.udp import (
    HEADER_SIZE,
    PACKET_TYPE_AUDIO,
    UdpCipher,
    UdpHeader,
    UdpKeys,
    check_packet,
    open_payload,
    seal,
)
from scripts.device_sim_paho import PahoConnection
from scripts.device_sim_turn import LostFrames
from scripts.device_sim_udp import MIC_FRAMES_ON_LISTEN, SILENT_FRAME, Impairment, UdpProtocol
from scripts.device_sim_ws import DeviceSimulator

__all__ = ["SILENT_FRAME", "Impairment", "MqttDeviceSimulator", "SubscribingMqttDevice"]

FIRMWARE_HELLO_VERSION = 3


class MqttDeviceSimulator(DeviceSimulator):
    """A firmware-like MQTT + UDP device. Same API as the WebSocket `DeviceSimulator`."""

    subscribes = False

    def __init__(
        self,
        base_url: str,
        *,
        uplink: Impairment | None = None,
        downlink: Impairment | None = None,
        keepalive_s: int | None = None,
        tls: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(base_url, protocol_version=FIRMWARE_HELLO_VERSION, **kwargs)
        self.tls = tls  # None: as the firmware, TLS exactly when the endpoint's port is 8883
        self.conn = XiaozhiConnection(Role.DEVICE, binary_version=FIRMWARE_HELLO_VERSION, transport="udp")
        self.mqtt: dict[str, Any] | None = None  # the OTA's `mqtt` object
        self.uplink = uplink or Impairment()
        self.downlink = downlink or Impairment()
        self.keepalive_s = keepalive_s
        self.keys: UdpKeys | None = None
        self.udp_address: tuple[str, int] | None = None
        self._cipher: UdpCipher | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self.local_sequence = 0
        self.remote_sequence = 0
        self.downlink_late = 0  # dropped as the firmware drops them: sequence below the last one
        self.downlink_lost = 0  # sequence gaps (concealed when the turn's audio is decoded)
        self.downlink_bad = 0  # short, wrong type or wrong length
        self.goodbye = asyncio.Event()  # the server closed the audio channel (goodbye with our session id)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._connack: asyncio.Future[int] | None = None
        self._pings: asyncio.Queue[None] = asyncio.Queue()
        self.subacks: asyncio.Queue[list[int]] = asyncio.Queue()  # return codes of each SUBACK (tests)

    # ---- OTA and the MQTT connection ----------------------------------------------------------

    async def ota(self) -> dict[str, Any]:
        data = await super().ota()
        if "mqtt" not in data:
            raise RuntimeError("OTA sent no `mqtt` object: is transport.mqtt enabled for this device?")
        self.mqtt = data["mqtt"]
        return data

    def endpoint(self) -> tuple[str, int]:
        assert self.mqtt is not None
        host, sep, port = self.mqtt["endpoint"].rpartition(":")
        return (host, int(port)) if sep else (self.mqtt["endpoint"], 8883)

    async def mqtt_connect(self, *, client_id: str | None = None, username: str | None = None,
                           password: str | None = None, timeout: float = 10.0, pings: bool = True,
                           protocol_level: int = 4) -> int:  # fmt: skip
        """Opens the MQTT connection (TLS exactly when the port is 8883, as the firmware); the CONNACK code.
        ``pings=False`` never sends PINGREQ (tests of the keepalive)."""
        if self.mqtt is None:
            await self.ota()
        assert self.mqtt is not None
        host, port = self.endpoint()
        tls = None
        if self.tls or (self.tls is None and port == 8883):
            import ssl

            tls = ssl.create_default_context()
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE  # the simulator has no CA bundle of the device's
        self._reader, self._writer = await asyncio.open_connection(host, port, ssl=tls)
        loop = asyncio.get_running_loop()
        self._connack = loop.create_future()
        self._tasks.append(asyncio.create_task(self._mqtt_read()))
        keepalive = self.keepalive_s or int(self.mqtt.get("keepalive", 240))
        packet = mq.connect_packet(
            client_id if client_id is not None else self.mqtt["client_id"],
            username if username is not None else self.mqtt["username"],
            password if password is not None else self.mqtt["password"],
            keepalive,
        )
        packet.proto_level = protocol_level
        self._write(packet.to_bytes())
        async with asyncio.timeout(timeout):
            code = await self._connack
        if code == 0 and pings:
            self._tasks.append(asyncio.create_task(self._keepalive(keepalive)))
        return code

    async def connect(self, *, features: dict[str, Any] | None = None, timeout: float = 10.0) -> ServerHello:
        if self._writer is None:
            code = await self.mqtt_connect(timeout=timeout)
            if code != 0:
                raise ConnectionError(f"MQTT CONNACK {code}")
        if features is None:
            features = {"mcp": self.mcp_tools is not None}
        self.conn.session_id = ""  # the firmware forgets the old session before its hello
        # the firmware's hello (GetHelloMessage): its uplink is Opus 16 kHz mono 60 ms
        await self.send(Hello(version=FIRMWARE_HELLO_VERSION, transport="udp", features=features,
                              audio_params=AudioParams()))  # fmt: skip
        record = await self.next_event(ServerHello, timeout=timeout)
        hello: ServerHello = record.event
        assert hello.udp is not None
        self.server_hello = hello
        self.keys = UdpKeys.from_params(hello.udp)
        self._cipher = UdpCipher(self.keys.key)
        self.local_sequence = self.remote_sequence = 0
        await self._open_udp(hello.udp.server, hello.udp.port)
        from audio_codecs.opus import OpusDecoder

        self._decoder = OpusDecoder(hello.audio_params.sample_rate)
        return hello

    async def _open_udp(self, server: str, port: int) -> None:
        self._close_udp()
        loop = asyncio.get_running_loop()
        # connected, as the firmware's: the kernel only delivers datagrams from the announced address
        self._udp, _ = await loop.create_datagram_endpoint(
            lambda: UdpProtocol(lambda data: self.downlink.apply(data, self._on_datagram)),
            remote_addr=(server, port),
        )
        self.udp_address = self._udp.get_extra_info("sockname")

    def _close_udp(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None

    async def rebind_udp(self) -> None:
        """A new local UDP port toward the same server (a NAT rebinding, as the server sees it)."""
        assert self.server_hello is not None and self.server_hello.udp is not None
        await self._open_udp(self.server_hello.udp.server, self.server_hello.udp.port)

    async def close(self) -> None:
        """Closes the audio channel with a goodbye (as the firmware does), then the MQTT connection."""
        self.mcp.close()
        if self.mqtt_open and self.conn.session_id and not self.goodbye.is_set():
            with contextlib.suppress(Exception):
                await self.send(Goodbye())
        await self.mqtt_disconnect()

    @property
    def mqtt_open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing() and not self.closed.is_set()

    async def mqtt_disconnect(self) -> None:
        self._close_udp()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._write(mq.DisconnectPacket().to_bytes())
                self._writer.close()
                await asyncio.wait_for(self._writer.wait_closed(), 2)
        await self._stop_tasks()

    async def _stop_tasks(self) -> None:
        """Cancels the connection's tasks and waits for them; the device counts as closed."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self.closed.set()

    # ---- sending ---------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)

    async def publish(self, text: str, *, topic: str | None = None, qos: int = 0, packet_id: int = 1) -> None:
        assert self.mqtt is not None and self._writer is not None
        packet = mq.PublishPacket.build(topic or self.mqtt["publish_topic"], text.encode("utf-8"),
                                        packet_id if qos else None, False, qos, False)  # fmt: skip
        self._write(packet.to_bytes())
        await self._writer.drain()

    async def send(self, event: Any) -> None:
        if isinstance(event, AudioIn):
            self.send_audio(event.opus, event.timestamp_ms)
            return
        await self.publish(self.conn.send(event))  # type: ignore[arg-type]

    async def send_raw(self, data: str | bytes) -> None:
        if isinstance(data, bytes):
            raise TypeError("audio goes over UDP on this transport")
        await self.publish(data)

    def uplink_packet(self, opus: bytes, timestamp_ms: int = 0) -> bytes:
        """The next uplink datagram, built from the nonce as the firmware builds it."""
        assert self.keys is not None and self._cipher is not None
        self.local_sequence += 1
        nonce = self.keys.nonce
        header = UdpHeader(ssrc=nonce.ssrc, timestamp=timestamp_ms & 0xFFFFFFFF, sequence=self.local_sequence,
                           flags=nonce.flags, type=nonce.type)  # fmt: skip
        return seal(self._cipher, header, opus)

    def send_audio(self, opus: bytes, timestamp_ms: int = 0) -> None:
        data = self.uplink_packet(opus, timestamp_ms)
        self.uplink.apply(data, self.send_datagram)

    def send_datagram(self, data: bytes) -> None:
        if self._udp is not None:
            self._udp.sendto(data)

    async def listen_start(self, mode: str = "auto") -> None:
        """`listen start`, then the microphone's first frames: the firmware streams its microphone from
        here on (this simulator sends `MIC_FRAMES_ON_LISTEN` silent frames unless it speaks), and the
        server learns the device's UDP address from them."""
        await super().listen_start(mode)
        for _ in range(MIC_FRAMES_ON_LISTEN):
            self.send_audio(SILENT_FRAME)

    # ---- receiving -------------------------------------------------------------------------

    def _on_datagram(self, data: bytes) -> None:
        if self._cipher is None:
            return
        try:
            header = check_packet(data, max_payload=65535)
        except Exception:
            self.downlink_bad += 1
            return
        if header.type != PACKET_TYPE_AUDIO:
            self.downlink_bad += 1
            return
        if header.sequence < self.remote_sequence:
            self.downlink_late += 1  # the firmware: "old sequence", dropped
            return
        if self.remote_sequence and header.sequence > self.remote_sequence + 1:
            gap = header.sequence - self.remote_sequence - 1
            self.downlink_lost += gap
            self._record(LostFrames(gap))
        self.remote_sequence = header.sequence
        event = AudioOut(opus=open_payload(self._cipher, data), timestamp_ms=header.timestamp)
        self.raw_frames.append(data[HEADER_SIZE:])
        if self.on_audio is not None:
            self.on_audio(event)
        self._record(event)

    async def _on_text(self, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("type") == "goodbye":
            # the firmware honours a goodbye only with its own session id
            if message.get("session_id") == self.conn.session_id:
                self.goodbye.set()
                self._close_udp()
            self._record(Goodbye())
            return
        event = self.conn.receive_text(text)
        if isinstance(event, McpMessage):
            await self.mcp.answer(event.payload)
        self._record(event)

    async def _mqtt_read(self) -> None:
        assert self._reader is not None
        try:
            while True:
                packet = await mq.read_packet(self._reader, 1 << 20)
                if packet is None:
                    break
                if isinstance(packet, mq.ConnackPacket):
                    if self._connack is not None and not self._connack.done():
                        self._connack.set_result(packet.return_code)
                elif isinstance(packet, mq.PublishPacket):  # whatever the topic: the firmware never subscribes
                    await self._on_text((packet.data or b"").decode("utf-8"))
                elif isinstance(packet, mq.PingRespPacket):
                    self._pings.put_nowait(None)
                elif isinstance(packet, mq.SubackPacket):
                    self.subacks.put_nowait(list(packet.payload.return_codes))
        except (OSError, asyncio.IncompleteReadError, mq.MalformedPacket):
            pass
        finally:
            if self._connack is not None and not self._connack.done():
                self._connack.set_exception(ConnectionError("closed before CONNACK"))
            self.closed.set()

    async def _keepalive(self, keepalive_s: int) -> None:
        while True:
            await asyncio.sleep(keepalive_s)
            with contextlib.suppress(Exception):
                self._write(mq.PingReqPacket().to_bytes())

    async def ping(self, timeout: float = 5.0) -> None:
        """One PINGREQ, answered by a PINGRESP."""
        self._write(mq.PingReqPacket().to_bytes())
        async with asyncio.timeout(timeout):
            await self._pings.get()


class SubscribingMqttDevice(MqttDeviceSimulator):
    """The py-xiaozhi client's way of doing MQTT: paho-mqtt in its own network thread, subscribed to
    `subscribe_topic`, uplink headers that keep the nonce's timestamp field (py-xiaozhi builds them from
    the nonce's hex: type and flags, the length, the nonce's ssrc and timestamp, the sequence)."""

    subscribes = True

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.paho = PahoConnection(self._on_text, lambda: self.closed.set())
        self.subscribed = self.paho.subscribed
        self.granted = self.paho.granted

    async def mqtt_connect(self, *, client_id: str | None = None, username: str | None = None,
                           password: str | None = None, timeout: float = 10.0, pings: bool = True,
                           protocol_level: int = 4) -> int:  # fmt: skip
        if self.mqtt is None:
            await self.ota()
        assert self.mqtt is not None
        host, port = self.endpoint()
        keepalive = self.keepalive_s or int(self.mqtt.get("keepalive", 240))
        return await self.paho.connect(self.mqtt, host, port, keepalive, client_id=client_id, username=username,
                                       password=password, tasks=self._tasks, timeout=timeout)  # fmt: skip

    async def publish(self, text: str, *, topic: str | None = None, qos: int = 0, packet_id: int = 1) -> None:
        assert self.mqtt is not None and self.paho.client is not None
        await self.paho.publish(topic or self.mqtt["publish_topic"], text, qos)

    def uplink_packet(self, opus: bytes, timestamp_ms: int = 0) -> bytes:
        assert self.keys is not None and self._cipher is not None
        self.local_sequence += 1
        nonce = self.keys.nonce.pack().hex()
        header = bytes.fromhex(nonce[:4] + f"{len(opus):04x}" + nonce[8:24] + f"{self.local_sequence:08x}")
        return header + self._cipher.apply(header, opus)

    async def ping(self, timeout: float = 5.0) -> None:
        raise NotImplementedError("paho sends its own pings")

    @property
    def mqtt_open(self) -> bool:
        return self.paho.is_open

    async def mqtt_disconnect(self) -> None:
        self._close_udp()
        await self.paho.disconnect()
        await self._stop_tasks()
