"""How devices reach their sessions (docs/mqtt-udp.md, docs/architecture.md).

- `base.py`: the `DeviceTransport` interface below `Session`, and `DatagramAudio` for transports
  whose audio goes outside the message stream.
- `websocket.py`: the WebSocket (the endpoint is gateway/device/socket.py).
- MQTT + UDP, the firmware's other protocol: `mqtt.py` (the MQTT 3.1.1 listener devices connect to,
  inside the gateway's event loop), `mqtt_codec.py` (packets, through amqtt's packet classes),
  `mqtt_credentials.py` (per-device credentials, HMAC-signed), `mqtt_session.py` (one session's
  transport: MQTT messages + UDP audio), `udp.py` (the one datagram endpoint for all devices),
  `udp_channel.py` (one session's packet checks: sequence, address, decryption), `ota_offer.py`
  (the OTA reply's `mqtt` object), `metrics.py`.

Nothing is imported here: the WebSocket path must not load the MQTT codec.
"""
