"""The device transports besides the WebSocket: MQTT for control and encrypted UDP for audio
(`transport.mqtt`, `transport.udp`; docs/mqtt-udp.md). Off by default."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from gateway.config.base import Section

# host[:port]: a DNS name, an IPv4 address or a bracketed IPv6 address, with an optional port
ENDPOINT_PATTERN = r"^$|^([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:\d{1,5})?$"
HOST_PATTERN = r"^$|^[A-Za-z0-9.\-]+$|^[0-9A-Fa-f:.]+$"


class MqttConfig(Section):
    """The MQTT 3.1.1 listener devices connect to (gateway/transport/mqtt.py)."""

    enabled: bool = False
    host: str = "0.0.0.0"
    port: int = Field(1883, ge=0, le=65535)  # 0: any free port (tests)
    # TLS on the listener: both paths, or neither (a plain listener, e.g. on a LAN or behind a TLS terminator)
    tls_cert: str = ""
    tls_key: str = ""
    # host[:port] OTA hands out; no port means 8883, and the firmware uses TLS exactly when the port is 8883
    public_endpoint: str = Field("", pattern=ENDPOINT_PATTERN)
    devices: list[str] = Field(default_factory=list)  # Device-Ids OTA sends `mqtt` to
    all_devices: bool = False  # every device OTA admits gets `mqtt` (then `devices` is not needed)
    keepalive_s: int = Field(240, ge=10, le=3600)  # sent in OTA; the listener allows 1.5 x the device's own
    credential_ttl_s: float = Field(30 * 86400, ge=60, le=366 * 86400)
    connect_timeout_s: float = Field(10, gt=0, le=120)  # from TCP accept to CONNECT
    max_packet_bytes: int = Field(65536, ge=1024, le=1 << 24)
    max_packets_per_s: float = Field(50, gt=0)  # sustained, per connection (a burst of 4x is allowed)
    write_timeout_s: float = Field(10, gt=0, le=120)  # a device that reads nothing for this long is dropped
    max_connections: int = Field(10000, ge=1)

    @field_validator("devices")
    @classmethod
    def _normalized_ids(cls, v: list[str]) -> list[str]:
        from gateway.xiaozhi.handshake import normalize_device_id

        return [normalize_device_id(item) or item for item in v]

    @model_validator(mode="after")
    def _tls_pair(self) -> MqttConfig:
        if self.enabled and bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: set both, or neither")
        return self


class UdpConfig(Section):
    """The one UDP endpoint that carries every MQTT device's audio (gateway/transport/udp.py)."""

    host: str = "0.0.0.0"
    port: int = Field(8884, ge=0, le=65535)  # 0: any free port (tests)
    # The address announced in the hello (`udp.server`). Empty: the local address the device's MQTT
    # connection reached, which is right unless a NAT or a balancer sits in front.
    public_host: str = Field("", pattern=HOST_PATTERN)
    public_port: int = Field(0, ge=0, le=65535)  # 0: `port` (the bound one)
    max_payload_bytes: int = Field(1500, ge=64, le=65000)  # one Opus packet
    # A packet more than this many sequence numbers ahead of the last one is dropped (forged or stale).
    sequence_window: int = Field(3000, ge=16, le=1 << 30)
    conceal_max_frames: int = Field(5, ge=0, le=50)  # lost frames given to the decoder's concealment per gap
    queue_packets: int = Field(64, ge=4, le=4096)  # uplink packets waiting for the session; more are dropped


class TransportConfig(Section):
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    udp: UdpConfig = Field(default_factory=UdpConfig)
