"""MQTT 3.1.1 packets, read and written with amqtt's packet classes.

Why amqtt: it is the maintained asyncio MQTT broker/client for Python (PyPI `amqtt`, releases through
2026) and its `amqtt.mqtt` package has a class per MQTT 3.1.1 packet type for both directions
(CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP,
DISCONNECT), so the codec, the server and the simulators share one tested implementation of the wire
format. paho-mqtt and gmqtt are clients only (they cannot parse a CONNECT or build a CONNACK). We use
amqtt's packets, not its broker: the firmware never subscribes, so a broker would deliver nothing to
it, and connection handling, credentials, per-device topics and pushes are ours (gateway/transport/mqtt.py).

amqtt pins `websockets==15.0.1` for its broker's WebSocket listener, which we do not use and which
would replace this project's websockets; scripts/setup.sh therefore installs it with `--no-deps`. Its
packet modules import only websockets, pyyaml and typing_extensions, which are ours already.

Bounds: a packet's remaining length is read from its fixed header first and refused past the
caller's limit before any of its body is read; the body is then read whole and decoded from memory,
so a slow or truncated packet never leaves the decoder half way.
"""

from __future__ import annotations

import asyncio
from typing import Any

try:
    from amqtt.adapters import BufferReader, StreamReaderAdapter
    from amqtt.mqtt import packet_dict
    from amqtt.mqtt.connack import ConnackPacket
    from amqtt.mqtt.connect import ConnectPacket, ConnectPayload, ConnectVariableHeader
    from amqtt.mqtt.disconnect import DisconnectPacket
    from amqtt.mqtt.packet import (
        CONNACK,
        CONNECT,
        DISCONNECT,
        PINGREQ,
        PINGRESP,
        PUBACK,
        PUBLISH,
        SUBACK,
        SUBSCRIBE,
        UNSUBACK,
        UNSUBSCRIBE,
        MQTTFixedHeader,
    )
    from amqtt.mqtt.pingreq import PingReqPacket
    from amqtt.mqtt.pingresp import PingRespPacket
    from amqtt.mqtt.puback import PubackPacket
    from amqtt.mqtt.publish import PublishPacket
    from amqtt.mqtt.suback import SubackPacket
    from amqtt.mqtt.subscribe import SubscribePacket
    from amqtt.mqtt.unsuback import UnsubackPacket
    from amqtt.mqtt.unsubscribe import UnsubscribePacket
except ImportError as exc:  # the gateway runs without it as long as MQTT is off
    raise ImportError(
        "transport.mqtt needs amqtt's MQTT packet classes: pip install --no-deps amqtt==0.12.1 "
        "(scripts/setup.sh does this)"
    ) from exc

__all__ = [
    "CONNACK", "CONNECT", "DISCONNECT", "PINGREQ", "PINGRESP", "PUBACK", "PUBLISH", "SUBACK", "SUBSCRIBE",
    "UNSUBACK", "UNSUBSCRIBE", "ConnackPacket", "ConnectPacket", "DisconnectPacket", "MalformedPacket",
    "Packet", "PacketTooLarge", "PingReqPacket", "PingRespPacket", "PubackPacket", "PublishPacket",
    "SubackPacket", "SubscribePacket", "UnsubackPacket", "UnsubscribePacket", "connect_packet", "read_packet",
]  # fmt: skip

Packet = Any  # an amqtt MQTTPacket subclass (amqtt's generics say little more)

# CONNACK return codes (MQTT 3.1.1 section 3.2.2.3)
ACCEPTED = 0x00
UNACCEPTABLE_PROTOCOL = 0x01
IDENTIFIER_REJECTED = 0x02
BAD_CREDENTIALS = 0x04
NOT_AUTHORIZED = 0x05
SUBACK_FAILURE = 0x80


class MalformedPacket(Exception):
    """The peer sent bytes that are not an MQTT 3.1.1 packet."""


class PacketTooLarge(MalformedPacket):
    """A packet's remaining length is over the limit (nothing of its body was read)."""


async def read_packet(reader: asyncio.StreamReader, max_bytes: int) -> Packet | None:
    """The next packet, or None at a clean end of stream (between packets).

    Raises PacketTooLarge, MalformedPacket, or asyncio.IncompleteReadError for a stream cut mid-packet.
    """
    try:
        fixed = await MQTTFixedHeader.from_stream(StreamReaderAdapter(reader))
    except asyncio.IncompleteReadError:
        raise
    except Exception as exc:  # amqtt raises MQTTError for a remaining length of more than 4 bytes
        raise MalformedPacket(f"bad fixed header: {exc}") from None
    if fixed is None:
        return None
    if fixed.remaining_length > max_bytes:
        raise PacketTooLarge(f"packet of {fixed.remaining_length} bytes (limit {max_bytes})")
    body = await reader.readexactly(fixed.remaining_length)
    kind = packet_dict.get(fixed.packet_type)
    if kind is None:
        raise MalformedPacket(f"unknown packet type {fixed.packet_type}")
    try:
        return await kind.from_stream(BufferReader(body), fixed_header=fixed)
    except Exception as exc:  # amqtt's NoDataError, MQTTError, CodecError, ValueError, struct.error, ...
        raise MalformedPacket(f"bad {kind.__name__}: {type(exc).__name__}") from None


def connect_packet(client_id: str, username: str | None, password: str | None, keepalive_s: int) -> Packet:
    """A clean-session MQTT 3.1.1 CONNECT (the simulators and tests)."""
    header = ConnectVariableHeader(keep_alive=keepalive_s, proto_name="MQTT", proto_level=0x04)
    header.clean_session_flag = True
    header.username_flag = username is not None
    header.password_flag = password is not None
    return ConnectPacket(variable_header=header, payload=ConnectPayload(client_id, None, None, username, password))
