"""One device's MQTT connection (docs/mqtt-udp.md), accepted by ``MqttGateway`` (gateway/transport/mqtt.py).

- CONNECT first, within `connect_timeout_s`: MQTT 3.1.1 only; the username and password OTA issued for
  this client id, compared in constant time (gateway/transport/mqtt_credentials.py), and the device
  still allowed MQTT (the checks: gateway/transport/mqtt_checks.py). Refusals get the CONNACK return
  code and one INFO line without secrets.
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
from typing import TYPE_CHECKING, Any, Protocol

from gateway.device.session import Session
from gateway.transport import mqtt_codec as mq
from gateway.transport.mqtt_checks import Refused, TokenBucket, check_connect, check_publish, suback_codes
from gateway.transport.mqtt_credentials import MqttIdentity
from gateway.transport.mqtt_session import MqttUdpTransport
from gateway.xiaozhi import HandshakeInfo

if TYPE_CHECKING:
    from gateway.config import Config, MqttConfig
    from gateway.services import Services
    from gateway.transport.metrics import TransportMetrics
    from gateway.transport.mqtt_credentials import MqttCredentials
    from gateway.transport.udp import UdpAudioServer


class ConnectionHost(Protocol):
    """What a connection needs of the listener that accepted it (``MqttGateway``, gateway/transport/mqtt.py)."""

    config: Config
    cfg: MqttConfig
    services: Services
    credentials: MqttCredentials
    metrics: TransportMetrics
    udp: UdpAudioServer
    closing: bool

    def allowed(self, device_id: str | None) -> bool: ...

    def claim(self, device_id: str, connection: MqttConnection) -> MqttConnection | None: ...

    def release(self, device_id: str, connection: MqttConnection) -> None: ...

log = logging.getLogger("gateway.transport.mqtt")

FIRMWARE_FRAME_MS = (10, 20, 40, 60, 80, 100, 120)
SESSION_END_TIMEOUT_S = 10.0  # a session asked to end gets this long before it is cancelled


class _LiveSession:
    def __init__(self, session: Session, transport: MqttUdpTransport, task: asyncio.Task[None]) -> None:
        self.session, self.transport, self.task = session, transport, task


class MqttConnection:
    """One device's MQTT connection: authentication, its packets, its sessions one after another."""

    def __init__(self, gateway: ConnectionHost, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
        try:
            identity = check_connect(packet, self.gateway.credentials, self.gateway.allowed)
        except Refused as refused:
            if refused.connack is not None:
                await self._connack(refused.connack)
            raise
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
                codes = suback_codes(packet, identity)
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
        check_publish(packet, identity)
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
