"""Prometheus metrics of the MQTT + UDP transport, on the gateway's registry (gateway/metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class TransportMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.mqtt_connections = Gauge("xz_mqtt_connections", "MQTT device connections open now", registry=r)
        self.mqtt_refused = Counter(
            "xz_mqtt_refused", "MQTT connections refused or closed for a violation, by reason", ["reason"],
            registry=r,
        )  # fmt: skip
        self.mqtt_messages = Counter(
            "xz_mqtt_messages", "MQTT PUBLISH packets, by direction (in: from devices)", ["direction"], registry=r
        )
        self.udp_received = Counter("xz_udp_received", "Uplink UDP audio packets accepted", registry=r)
        self.udp_dropped = Counter(
            "xz_udp_dropped", "Uplink UDP datagrams dropped, by reason", ["reason"], registry=r
        )
        self.udp_lost = Counter("xz_udp_lost", "Uplink UDP packets missing (sequence gaps)", registry=r)
        self.udp_concealed = Counter(
            "xz_udp_concealed", "Lost uplink packets given to the Opus decoder's concealment", registry=r
        )
        self.udp_sent = Counter("xz_udp_sent", "Downlink UDP audio packets sent", registry=r)
        self.udp_unsent = Counter(
            "xz_udp_unsent", "Downlink packets not sent: the device's UDP address is not known yet", registry=r
        )
        self.udp_dropped_out = Counter(
            "xz_udp_send_failed", "Downlink packets the socket would not take (send buffer full)", registry=r
        )
        self.udp_rebinds = Counter(
            "xz_udp_rebinds", "Sessions moved to a new device address (NAT rebinding)", registry=r
        )
