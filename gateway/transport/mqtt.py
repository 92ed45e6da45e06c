"""The MQTT 3.1.1 listener devices connect to, inside the gateway's event loop (docs/mqtt-udp.md).

The firmware never subscribes: it publishes its JSON messages to the `publish_topic` OTA gave it and
handles every PUBLISH that arrives on its connection, whatever the topic. So this is no broker: each
connection is one authenticated device, and the server's messages are pushed straight to it (on the
device's `subscribe_topic`, which the py-xiaozhi client does subscribe to; that is accepted too).

Per connection:

- CONNECT first, within `connect_timeout_s`: MQTT 3.1.1 only; the username and password OTA issued for
  this client id, compared in constant time (gateway/transport/mqtt_credentials.py), and the device
  still allowed MQTT. Refusals get the CONNACK return code and one INFO line without secrets.
- One live connection per device: a new one replaces the old (whose session ends).
- PUBLISH on the device's own publish topic only, QoS 0 or 1 (PUBACK); anything else closes the
  connection. SUBSCRIBE is granted for its own subscribe topic only (0x80 for any other filter).
- Keepalive: no packet for 1.5 times the device's keepalive closes it. Packets are bounded in size
  (`max_packet_bytes`, refused before the body is read) and in rate (`max_packets_per_s`, a token
  bucket); writes to a device that stops reading time out (`write_timeout_s`).

Each `hello` starts a session (gateway/device/session.py) on a `MqttUdpTransport`
(gateway/transport/mqtt_session.py), ending the one before it; a `goodbye` with the session's id ends
it; other messages go to the live session. The connection closing ends its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gateway.config import Config
from gateway.device.session import Session
from gateway.security.device_tokens import DeviceAuth, load_secret
from gateway.transport import mqtt_codec as mq
from gateway.transport.metrics import TransportMetrics
from gateway.transport.mqtt_credentials import CredentialError, MqttCredentials, MqttIdentity
from gateway.transport.mqtt_session import MqttUdpTransport
from gateway.transport.udp import UdpAudioServer
from gateway.xiaozhi import HandshakeInfo

if TYPE_CHECKING:
    from fastapi import Request

    from gateway.services import Services

log = logging.getLogger(__name__)

FIRMWARE_FRAME_MS = (10, 20, 40, 60, 80, 100, 120)
SESSION_END_TIMEOUT_S = 10.0  # a session asked to end gets this long before it is cancelled


class Refused(Exception):
    """The connection is closed for a reason worth one log line (and a metric label)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class TokenBucket:
    """`rate` packets per second on average, bursts of `burst`."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class MqttGateway:
    """The MQTT listener and the UDP audio endpoint, started and stopped in the app's lifespan."""

    def __init__(self, config: Config, services: Services, device_auth: DeviceAuth) -> None:
        self.config = config
        self.cfg = config.transport.mqtt
        self.services = services
        self.device_auth = device_auth
        secret, source = load_secret(config.server.auth)
        if source == "random":
            log.warning(
                "transport.mqtt: no server.auth.secret or secret_file; MQTT credentials are signed with a "
                "random key and stop working when the server restarts (devices get new ones at their next OTA)"
            )
        self.credentials = MqttCredentials(secret, self.cfg.credential_ttl_s)
        self.metrics = TransportMetrics(services.metrics.registry)
        self.udp = UdpAudioServer(config.transport.udp, self.metrics)
        self.connections: dict[str, MqttConnection] = {}  # Device-Id -> its live connection
        self._open: set[MqttConnection] = set()
        self._server: asyncio.Server | None = None
        self.closing = False
        self.port = 0

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self.udp.start()
        tls = None
        if self.cfg.tls_cert:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        self._server = await asyncio.start_server(
            self._accept,
            self.cfg.host,
            self.cfg.port,
            ssl=tls,
            ssl_handshake_timeout=self.cfg.connect_timeout_s if tls else None,
            limit=self.cfg.max_packet_bytes + 16,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        public = self.cfg.public_endpoint or f"<OTA host>:{self.port}"
        log.info("MQTT listener on %s:%d (%s), devices reach it at %s", self.cfg.host, self.port,
                 "TLS" if tls else "plain", public)  # fmt: skip
        port = _endpoint_port(public) if self.cfg.public_endpoint else self.port
        if (port == 8883) != (tls is not None):
            log.warning(
                "transport.mqtt: devices use TLS exactly when the endpoint's port is 8883; the endpoint's port "
                "is %d and this listener is %s (right only with a TLS terminator or a port mapping in front)",
                port, "TLS" if tls else "plain",
            )  # fmt: skip

    def stop_accepting(self) -> None:
        """No new connections and no new sessions (shutdown: the sessions are closed next)."""
        self.closing = True
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        self.stop_accepting()
        for connection in list(self._open):
            connection.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SESSION_END_TIMEOUT_S):
                while self._open:
                    await next(iter(self._open)).done.wait()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()
        self.udp.close()

    # ---- OTA ------------------------------------------------------------------------------

    def allowed(self, device_id: str | None) -> bool:
        """Does this device get (and may it use) MQTT? `devices` or `all_devices`, and admitted by server.auth."""
        if not device_id or not self.cfg.enabled:
            return False
        if self.device_auth.signer is not None and not self.device_auth.admitted(device_id):
            return False
        return self.cfg.all_devices or device_id in self.cfg.devices

    def offer(self, request: Request, device_id: str | None, client_id: str | None) -> dict[str, Any] | None:
        """The OTA reply's `mqtt` object for this device, or None."""
        if not device_id or not self.allowed(device_id):
            return None
        identity, password = self.credentials.issue(device_id, client_id)
        return {
            "endpoint": self.cfg.public_endpoint or f"{_request_host(self.config, request)}:{self.port}",
            "client_id": identity.mqtt_client_id,
            "username": identity.username,
            "password": password,
            "keepalive": self.cfg.keepalive_s,
            "publish_topic": identity.publish_topic,
            "subscribe_topic": identity.subscribe_topic,
        }

    # ---- connections ----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = MqttConnection(self, reader, writer)
        if self.closing or len(self._open) >= self.cfg.max_connections:
            log.warning("MQTT connection from %s refused: %s", connection.peer,
                        "shutting down" if self.closing else f"{len(self._open)} connections open")  # fmt: skip
            self.metrics.mqtt_refused.labels("capacity").inc()
            writer.close()
            return
        self._open.add(connection)
        self.metrics.mqtt_connections.inc()
        try:
            await connection.run()
        finally:
            self._open.discard(connection)
            self.metrics.mqtt_connections.dec()
            connection.done.set()

    def claim(self, device_id: str, connection: MqttConnection) -> MqttConnection | None:
        old = self.connections.get(device_id)
        self.connections[device_id] = connection
        return old

    def release(self, device_id: str, connection: MqttConnection) -> None:
        if self.connections.get(device_id) is connection:
            del self.connections[device_id]


class _LiveSession:
    def __init__(self, session: Session, transport: MqttUdpTransport, task: asyncio.Task[None]) -> None:
        self.session, self.transport, self.task = session, transport, task


class MqttConnection:
    """One device's MQTT connection: authentication, its packets, its sessions one after another."""

    def __init__(self, gateway: MqttGateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.gateway = gateway
        self.cfg = gateway.cfg
        self.reader, self.writer = reader, writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.identity: MqttIdentity | None = None
        self.live: _LiveSession | None = None
        self.done = asyncio.Event()
        self._closed = False
        self._rate = TokenBucket(self.cfg.max_packets_per_s, 4 * self.cfg.max_packets_per_s)
        self._tg: asyncio.TaskGroup | None = None
        self._idle_limit_s = 1.5 * self.cfg.keepalive_s

    @property
    def alive(self) -> bool:
        return not self._closed and not self.writer.is_closing()

    def close(self) -> None:
        self._closed = True
        self.writer.close()

    async def run(self) -> None:
        metrics = self.gateway.metrics
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                try:
                    await self._connect()
                    await self._serve()
                finally:
                    await self._end_session(device_left=True)
        except* Refused as group:
            for exc in group.exceptions:
                assert isinstance(exc, Refused)
                metrics.mqtt_refused.labels(exc.reason).inc()
                who = self.identity.device_id if self.identity else self.peer
                log.info("MQTT connection of %s closed: %s", who, exc)
        except* (OSError, asyncio.IncompleteReadError, mq.MalformedPacket) as group:
            log.info("MQTT connection of %s ended: %s", self.identity.device_id if self.identity else self.peer,
                     group.exceptions[0] or type(group.exceptions[0]).__name__)  # fmt: skip
        finally:
            self._tg = None
            if self.identity is not None:
                self.gateway.release(self.identity.device_id, self)
            self.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self.writer.wait_closed()

    # ---- CONNECT ----------------------------------------------------------------------------

    async def _connect(self) -> None:
        try:
            async with asyncio.timeout(self.cfg.connect_timeout_s):
                packet = await mq.read_packet(self.reader, self.cfg.max_packet_bytes)
        except TimeoutError:
            raise Refused("connect_timeout", f"no CONNECT within {self.cfg.connect_timeout_s:g} s") from None
        except mq.PacketTooLarge as exc:
            raise Refused("too_large", str(exc)) from None
        if packet is None:
            raise ConnectionError("closed before CONNECT")
        if not isinstance(packet, mq.ConnectPacket):
            raise Refused("protocol", f"first packet is {type(packet).__name__}, not CONNECT")
        if packet.proto_name != "MQTT" or packet.proto_level != 4:
            await self._connack(mq.UNACCEPTABLE_PROTOCOL)
            raise Refused("protocol", f"protocol {packet.proto_name!r} level {packet.proto_level}, not MQTT 3.1.1")
        client_id = packet.client_id or ""
        try:
            identity = self.gateway.credentials.verify(client_id, packet.username, packet.password)
        except CredentialError as exc:
            await self._connack(mq.BAD_CREDENTIALS)
            raise Refused("credentials", f"refused client id {client_id[:80]!r}: {exc}") from None
        if not self.gateway.allowed(identity.device_id):
            await self._connack(mq.NOT_AUTHORIZED)
            raise Refused("not_allowed", f"device {identity.device_id} is not allowed MQTT (transport.mqtt.devices)")
        self.identity = identity
        keepalive = packet.keep_alive if 0 < packet.keep_alive <= 3600 else self.cfg.keepalive_s
        self._idle_limit_s = 1.5 * keepalive
        old = self.gateway.claim(identity.device_id, self)
        if old is not None:
            log.info("MQTT device %s reconnected; closing its previous connection", identity.device_id)
            old.close()
        await self._connack(mq.ACCEPTED)
        log.info("MQTT device %s connected from %s (keepalive %d s)", identity.device_id, self.peer, keepalive)

    async def _connack(self, code: int) -> None:
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            await self._write(mq.ConnackPacket.build(0, code).to_bytes())

    # ---- packets ----------------------------------------------------------------------------

    async def _serve(self) -> None:
        assert self.identity is not None
        identity = self.identity
        while not self._closed:
            try:
                async with asyncio.timeout(self._idle_limit_s):
                    packet = await mq.read_packet(self.reader, self.cfg.max_packet_bytes)
            except TimeoutError:
                raise Refused("keepalive", f"nothing received for {self._idle_limit_s:g} s (1.5 x keepalive)") from None
            except mq.PacketTooLarge as exc:
                raise Refused("too_large", str(exc)) from None
            except mq.MalformedPacket as exc:
                raise Refused("malformed", str(exc)) from None
            if packet is None:
                return
            if not self._rate.take():
                raise Refused("rate", f"more than {self.cfg.max_packets_per_s:g} packets per second")
            if isinstance(packet, mq.PublishPacket):
                await self._on_publish(packet, identity)
            elif isinstance(packet, mq.PingReqPacket):
                await self._write(mq.PingRespPacket.build().to_bytes())
            elif isinstance(packet, mq.SubscribePacket):
                codes = [0x00 if topic == identity.subscribe_topic else mq.SUBACK_FAILURE
                         for topic, _qos in packet.payload.topics]  # fmt: skip
                if mq.SUBACK_FAILURE in codes:
                    log.info("MQTT device %s: subscription to another topic refused", identity.device_id)
                await self._write(mq.SubackPacket.build(packet.variable_header.packet_id, codes).to_bytes())
            elif isinstance(packet, mq.UnsubscribePacket):
                await self._write(mq.UnsubackPacket.build(packet.variable_header.packet_id).to_bytes())
            elif isinstance(packet, mq.DisconnectPacket):
                return
            elif isinstance(packet, mq.PubackPacket):
                continue  # we publish at QoS 0; a stray acknowledgement is harmless
            else:
                raise Refused("protocol", f"unexpected {type(packet).__name__}")

    async def _on_publish(self, packet: Any, identity: MqttIdentity) -> None:
        if packet.topic_name != identity.publish_topic:
            raise Refused("topic", f"device {identity.device_id} published on a topic that is not its own")
        if packet.qos not in (0, 1):
            raise Refused("qos", f"PUBLISH at QoS {packet.qos} (0 and 1 are accepted)")
        if packet.qos == 1:
            await self._write(mq.PubackPacket.build(packet.packet_id).to_bytes())
        self.gateway.metrics.mqtt_messages.labels("in").inc()
        try:
            text = (packet.data or b"").decode("utf-8")
            message = json.loads(text)
        except (UnicodeDecodeError, ValueError, RecursionError):
            log.info("MQTT device %s: dropped a message that is not UTF-8 JSON", identity.device_id)
            return
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "hello":
            await self._start_session(text, message, identity)
            return
        live = self.live
        session_id = message.get("session_id") if isinstance(message, dict) else None
        if live is None or (isinstance(session_id, str) and session_id and session_id != live.session.session_id):
            log.debug("MQTT device %s: %r message for no live session dropped", identity.device_id, kind)
            return
        if kind == "goodbye":
            log.info("MQTT session %s: the device closed its audio channel", live.session.session_id)
            await self._end_session(device_left=True)
            return
        await live.transport.put_text(text)

    # ---- sessions ---------------------------------------------------------------------------

    async def _start_session(self, text: str, hello: dict[str, Any], identity: MqttIdentity) -> None:
        await self._end_session(device_left=True)  # the device opened a new channel: the old one is gone
        gateway = self.gateway
        if gateway.closing or self._tg is None:
            return
        services, udp_cfg = gateway.services, gateway.config.transport.udp
        params = hello.get("audio_params")
        frame_ms = params.get("frame_duration") if isinstance(params, dict) else None
        version = hello.get("version")
        transport = MqttUdpTransport(
            self,
            gateway.udp,
            gateway.metrics,
            udp_server=udp_cfg.public_host or self._local_host(),
            frame_ms=frame_ms if frame_ms in FIRMWARE_FRAME_MS else 60,
            queue_size=udp_cfg.queue_packets,
            conceal_max_frames=udp_cfg.conceal_max_frames,
            put_timeout_s=self.cfg.write_timeout_s,
        )
        info = HandshakeInfo(identity.device_id, identity.client_id or None, None,
                             version if version in (1, 2, 3) else 3, authenticated=True)  # fmt: skip
        session = Session(transport, info, services, datagrams=transport)
        transport.session_id = session.session_id
        registry = services.sessions
        key = registry.key_for(identity.device_id)
        old = registry.claim(key, session)
        if old is not None:
            log.info("device %s opened an MQTT session; closing its previous one", key)
            await old.close()
        task = self._tg.create_task(self._run_session(session, transport, key))
        self.live = _LiveSession(session, transport, task)
        await transport.put_text(text)

    async def _run_session(self, session: Session, transport: MqttUdpTransport, key: str) -> None:
        log.info("MQTT device %s: session %s started (UDP ssrc %08x)", key, session.session_id, transport.channel.ssrc)
        try:
            await session.run()
        except Exception:
            log.exception("MQTT session %s failed", session.session_id)
        finally:
            transport.end(device_left=False)
            self.gateway.services.sessions.release(key, session)
            if self.live is not None and self.live.session is session:
                self.live = None
            log.info("MQTT device %s: session %s ended", key, session.session_id)

    async def _end_session(self, *, device_left: bool) -> None:
        live, self.live = self.live, None
        if live is None:
            return
        live.transport.end(device_left=device_left)
        try:
            async with asyncio.timeout(SESSION_END_TIMEOUT_S):
                await asyncio.shield(live.task)
        except TimeoutError:
            log.warning("MQTT session %s did not end in %g s; cancelled", live.session.session_id,
                        SESSION_END_TIMEOUT_S)  # fmt: skip
            live.task.cancel()
        except Exception:
            pass  # logged by _run_session

    def _local_host(self) -> str:
        """The address the device reached us at: where its UDP goes unless transport.udp.public_host says."""
        sockname = self.writer.get_extra_info("sockname")
        host = str(sockname[0]) if sockname else "127.0.0.1"
        with contextlib.suppress(ValueError):
            address = ipaddress.ip_address(host)
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
                host = str(address.ipv4_mapped)
        return host

    # ---- writing ----------------------------------------------------------------------------

    async def push(self, text: str) -> None:
        """A server message to the device: PUBLISH QoS 0 on its subscribe topic, on this connection."""
        if not self.alive or self.identity is None:
            raise ConnectionError("the MQTT connection is closed")
        packet = mq.PublishPacket.build(self.identity.subscribe_topic, text.encode("utf-8"), None, False, 0, False)
        await self._write(packet.to_bytes())
        self.gateway.metrics.mqtt_messages.labels("out").inc()

    async def _write(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise ConnectionError("the MQTT connection is closed")
        self.writer.write(data)  # one whole packet per write: concurrent writers never interleave
        try:
            async with asyncio.timeout(self.cfg.write_timeout_s):
                await self.writer.drain()
        except TimeoutError:
            self.close()
            raise ConnectionError(f"the device read nothing for {self.cfg.write_timeout_s:g} s") from None


def _endpoint_port(endpoint: str) -> int:
    """The port the firmware takes from `host[:port]` (8883 without one)."""
    _host, sep, port = endpoint.rpartition(":")
    return int(port) if sep and port.isdigit() else 8883


def _request_host(config: Config, request: Request) -> str:
    """The host name devices used for OTA (as for the WebSocket URL, gateway/device/ota.py)."""
    from gateway.device.ota import websocket_url

    return urlsplit(websocket_url(config, request)).hostname or "127.0.0.1"
