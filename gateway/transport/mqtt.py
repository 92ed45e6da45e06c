"""The MQTT 3.1.1 listener devices connect to, inside the gateway's event loop (docs/mqtt-udp.md).

The firmware never subscribes: it publishes its JSON messages to the `publish_topic` OTA gave it and
handles every PUBLISH that arrives on its connection, whatever the topic. So this is no broker: each
connection is one authenticated device, and the server's messages are pushed straight to it (on the
device's `subscribe_topic`, which the py-xiaozhi client does subscribe to; that is accepted too).

`MqttGateway` here: the listener (TLS or plain, bounded connections), the UDP audio endpoint, OTA's
`mqtt` object, one live connection per device. A connection (CONNECT, its packets, its sessions) is
`MqttConnection` (gateway/transport/mqtt_connection.py); the checks of what a device sends (CONNECT
and credentials, PUBLISH, SUBSCRIBE, packet rate) are gateway/transport/mqtt_checks.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gateway.config import Config
from gateway.security.device_tokens import DeviceAuth, load_secret
from gateway.transport.metrics import TransportMetrics
from gateway.transport.mqtt_checks import Refused, TokenBucket
from gateway.transport.mqtt_connection import FIRMWARE_FRAME_MS, SESSION_END_TIMEOUT_S, MqttConnection
from gateway.transport.mqtt_credentials import MqttCredentials
from gateway.transport.udp import UdpAudioServer

if TYPE_CHECKING:
    from fastapi import Request

    from gateway.services import Services

__all__ = [
    "FIRMWARE_FRAME_MS",
    "SESSION_END_TIMEOUT_S",
    "MqttConnection",
    "MqttGateway",
    "Refused",
    "TokenBucket",
]

log = logging.getLogger(__name__)


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



def _endpoint_port(endpoint: str) -> int:
    """The port the firmware takes from `host[:port]` (8883 without one)."""
    _host, sep, port = endpoint.rpartition(":")
    return int(port) if sep and port.isdigit() else 8883


def _request_host(config: Config, request: Request) -> str:
    """The host name devices used for OTA (as for the WebSocket URL, gateway/device/ota.py)."""
    from gateway.device.ota import websocket_url

    return urlsplit(websocket_url(config, request)).hostname or "127.0.0.1"
