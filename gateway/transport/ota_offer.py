"""The OTA reply's `mqtt` object (gateway/device/ota.py calls this one function).

With `transport.mqtt.enabled` and the device allowed MQTT (`transport.mqtt.devices` or `all_devices`,
and admitted by `server.auth` when that is on), OTA adds `mqtt {endpoint, client_id, username,
password, keepalive, publish_topic, subscribe_topic}` with credentials for this device alone
(gateway/transport/mqtt_credentials.py). The firmware then uses MQTT + UDP even though `websocket` is
in the reply too (it keeps that for later). Otherwise the reply has no `mqtt` key at all.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request


def add_mqtt_offer(reply: dict[str, Any], request: Request, device_id: str | None, client_id: str | None) -> None:
    gateway = getattr(request.app.state, "mqtt", None)  # gateway/transport/mqtt.py's MqttGateway, when enabled
    if gateway is None:
        return
    offer = gateway.offer(request, device_id, client_id)
    if offer is not None:
        reply["mqtt"] = offer
