"""The MQTT listener's checks of what a device sends (docs/mqtt-udp.md): its CONNECT (MQTT 3.1.1, the
credentials OTA issued, still allowed MQTT), its PUBLISH (its own topic, QoS 0 or 1), its SUBSCRIBE
(its own subscribe topic only), its packet rate; a failed check is a ``Refused`` (a reason for the log
line and the metric label, and the CONNACK code where one is owed). Used by ``MqttConnection``
(gateway/transport/mqtt_connection.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.transport import mqtt_codec as mq
from gateway.transport.mqtt_credentials import CredentialError, MqttCredentials, MqttIdentity

__all__ = ["Refused", "TokenBucket", "check_connect", "check_publish", "suback_codes"]


class Refused(Exception):
    """The connection is closed for a reason worth one log line (and a metric label); ``connack``: the
    CONNACK return code the device gets first (None: none)."""

    def __init__(self, reason: str, detail: str, *, connack: int | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.connack = connack


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



def check_connect(packet: Any, credentials: MqttCredentials, allowed: Callable[[str], bool]) -> MqttIdentity:
    """The device a first packet authenticates: a CONNECT at MQTT 3.1.1 with the username and password
    OTA issued for its client id (compared in constant time), for a device still ``allowed`` MQTT."""
    if not isinstance(packet, mq.ConnectPacket):
        raise Refused("protocol", f"first packet is {type(packet).__name__}, not CONNECT")
    if packet.proto_name != "MQTT" or packet.proto_level != 4:
        raise Refused("protocol", f"protocol {packet.proto_name!r} level {packet.proto_level}, not MQTT 3.1.1",
                      connack=mq.UNACCEPTABLE_PROTOCOL)  # fmt: skip
    client_id = packet.client_id or ""
    try:
        identity = credentials.verify(client_id, packet.username, packet.password)
    except CredentialError as exc:
        raise Refused("credentials", f"refused client id {client_id[:80]!r}: {exc}",
                      connack=mq.BAD_CREDENTIALS) from None  # fmt: skip
    if not allowed(identity.device_id):
        raise Refused("not_allowed", f"device {identity.device_id} is not allowed MQTT (transport.mqtt.devices)",
                      connack=mq.NOT_AUTHORIZED)  # fmt: skip
    return identity


def check_publish(packet: Any, identity: MqttIdentity) -> None:
    """A device publishes on its own publish topic only, at QoS 0 or 1."""
    if packet.topic_name != identity.publish_topic:
        raise Refused("topic", f"device {identity.device_id} published on a topic that is not its own")
    if packet.qos not in (0, 1):
        raise Refused("qos", f"PUBLISH at QoS {packet.qos} (0 and 1 are accepted)")


def suback_codes(packet: Any, identity: MqttIdentity) -> list[int]:
    """SUBACK's return codes: granted (QoS 0) for the device's own subscribe topic, a failure for any other."""
    return [0x00 if topic == identity.subscribe_topic else mq.SUBACK_FAILURE
            for topic, _qos in packet.payload.topics]  # fmt: skip
