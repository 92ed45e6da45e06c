"""Per-device MQTT credentials (gateway/transport/mqtt_credentials.py) and the packet reader's bounds
(gateway/transport/mqtt_codec.py)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.transport import mqtt_codec as mq
from gateway.transport.mqtt_credentials import CredentialError, MqttCredentials, topic_id

SECRET = b"0123456789abcdef-secret"


def test_credentials_open_only_their_own_client_id_until_they_expire():
    creds = MqttCredentials(SECRET, ttl_s=60)
    identity, password = creds.issue("aa:bb:cc:dd:ee:ff", "uuid-1", now=1000)
    assert identity.mqtt_client_id == "xiaozhi@@@aa_bb_cc_dd_ee_ff"
    assert identity.publish_topic == "device-server/aa_bb_cc_dd_ee_ff"
    assert creds.verify(identity.mqtt_client_id, identity.username, password, now=1059) == identity
    with pytest.raises(CredentialError, match="expired"):
        creds.verify(identity.mqtt_client_id, identity.username, password, now=1060)
    other, other_password = creds.issue("aa:bb:cc:dd:ee:00", None, now=1000)
    with pytest.raises(CredentialError, match="bad password"):
        creds.verify(identity.mqtt_client_id, identity.username, other_password, now=1000)
    with pytest.raises(CredentialError, match="client id"):
        creds.verify(identity.mqtt_client_id, other.username, other_password, now=1000)
    with pytest.raises(CredentialError, match="bad password"):  # another key signs other passwords
        MqttCredentials(b"another-secret-of-16+", 60).verify(identity.mqtt_client_id, identity.username,
                                                             password, now=1000)  # fmt: skip
    for username in ("", "x", "xzm1.1.2", "xzm1.99.!!!.", "xzm1.1e3.YQ.", "xzm1." + "9" * 13 + ".YQ."):
        with pytest.raises(CredentialError):
            creds.verify(identity.mqtt_client_id, username, password, now=1000)


def test_topic_ids_keep_topics_free_of_wildcards_and_levels():
    assert topic_id("a/b+c#d e") == "a_b_c_d_e"


async def feed(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_a_packet_over_the_limit_is_refused_before_its_body_is_read():
    big = mq.PublishPacket.build("t", b"x" * 5000, None, False, 0, False).to_bytes()
    reader = asyncio.StreamReader()
    reader.feed_data(big[:5])  # the fixed header and a little: the rest never comes
    with pytest.raises(mq.PacketTooLarge):
        await asyncio.wait_for(mq.read_packet(reader, 4096), 1)


async def test_malformed_packets_raise_one_error_type():
    for data in (bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]),  # a remaining length of 5 bytes
                 bytes([0x00, 0x00]),  # packet type 0
                 bytes([0x10, 0x02, 0x00, 0x09])):  # a CONNECT cut short  # fmt: skip
        with pytest.raises(mq.MalformedPacket):
            await mq.read_packet(await feed(data), 4096)
    assert await mq.read_packet(await feed(b""), 4096) is None
    packet = await mq.read_packet(await feed(mq.connect_packet("c", "u", "p", 30).to_bytes()), 4096)
    assert (packet.client_id, packet.username, packet.password, packet.keep_alive) == ("c", "u", "p", 30)
