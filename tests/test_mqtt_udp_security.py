"""What one MQTT + UDP device cannot do to another, and the listener's bounds (docs/mqtt-udp.md).

Real gateway on loopback. A device cannot log in with another's credentials, publish on another's
topic or subscribe to it; nothing reaches a session over UDP without its key, a newer sequence and (or
else a proven move to) its address; a silent, oversized or flooding connection is closed.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time

import httpx

from gateway.transport import mqtt_codec as mq
from gateway.xiaozhi.udp import UdpCipher, UdpHeader, seal
from scripts.device_sim_mqtt import SILENT_FRAME, MqttDeviceSimulator
from tests.gateway_server import running_gateway
from tests.test_mqtt_udp_session import QUESTION, assert_clean_turn, merged, mqtt_config, wait_until
from tts_engine.backends.fake import FakeBackend

A, B = "02:00:00:00:0a:01", "02:00:00:00:0b:01"


async def metric_values(gw) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{gw.url}/metrics")).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("xz_")}  # fmt: skip


def dropped(values: dict[str, float], reason: str) -> float:
    return values.get(f'xz_udp_dropped_total{{reason="{reason}"}}', 0.0)


def refused(values: dict[str, float], reason: str) -> float:
    return values.get(f'xz_mqtt_refused_total{{reason="{reason}"}}', 0.0)


# ---- MQTT: credentials, topics -----------------------------------------------------------------


async def test_a_device_cannot_log_in_with_another_devices_credentials():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        a, b = MqttDeviceSimulator(gw.url, device_id=A), MqttDeviceSimulator(gw.url, device_id=B)
        await a.ota()
        offer_b = (await b.ota())["mqtt"]
        # A's client id with B's username and password
        assert await a.mqtt_connect(username=offer_b["username"], password=offer_b["password"]) == mq.BAD_CREDENTIALS
        await asyncio.wait_for(a.closed.wait(), 5)
        await a.mqtt_disconnect()
        # A's username with B's password; A's username with its device id changed to B's
        a2 = MqttDeviceSimulator(gw.url, device_id=A)
        offer_a = (await a2.ota())["mqtt"]
        assert await a2.mqtt_connect(password=offer_b["password"]) == mq.BAD_CREDENTIALS
        await a2.mqtt_disconnect()
        forged = offer_a["username"].split(".")
        forged[2] = offer_b["username"].split(".")[2]
        a3 = MqttDeviceSimulator(gw.url, device_id=A)
        a3.mqtt = offer_a
        assert await a3.mqtt_connect(username=".".join(forged)) == mq.BAD_CREDENTIALS
        await a3.mqtt_disconnect()
        # its own credentials work
        a4 = MqttDeviceSimulator(gw.url, device_id=A)
        a4.mqtt = offer_a
        assert await a4.mqtt_connect() == 0
        await a4.mqtt_disconnect()
        values = await metric_values(gw)
    assert refused(values, "credentials") == 3


async def test_expired_credentials_devices_no_longer_allowed_and_other_protocols_are_refused():
    cfg = mqtt_config(all_devices=False, devices=[A])
    async with running_gateway(cfg, backend=FakeBackend()) as gw:
        mqtt = gw.app.state.mqtt
        expired, password = mqtt.credentials.issue(A, "c", now=time.time() - mqtt.credentials.ttl_s - 1)
        sim = MqttDeviceSimulator(gw.url, device_id=A)
        sim.mqtt = (await sim.ota())["mqtt"]
        assert await sim.mqtt_connect(username=expired.username, password=password) == mq.BAD_CREDENTIALS
        await sim.mqtt_disconnect()
        # B gets no `mqtt` from OTA; credentials made for it anyway are refused as not allowed
        other, other_password = mqtt.credentials.issue(B, "c")
        sim_b = MqttDeviceSimulator(gw.url, device_id=B)
        sim_b.mqtt = {**sim.mqtt, "client_id": other.mqtt_client_id}
        assert await sim_b.mqtt_connect(username=other.username, password=other_password) == mq.NOT_AUTHORIZED
        await sim_b.mqtt_disconnect()
        old = MqttDeviceSimulator(gw.url, device_id=A)
        old.mqtt = sim.mqtt
        assert await old.mqtt_connect(protocol_level=3) == mq.UNACCEPTABLE_PROTOCOL
        await old.mqtt_disconnect()


async def test_publishing_on_another_devices_topic_closes_the_connection():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        a, b = MqttDeviceSimulator(gw.url, device_id=A), MqttDeviceSimulator(gw.url, device_id=B)
        await b.connect()
        await a.connect()
        b_session = gw.services.sessions[B]
        await a.publish('{"type":"listen","state":"detect","text":"hi"}', topic=b.mqtt["publish_topic"])
        await asyncio.wait_for(a.closed.wait(), 5)
        await wait_until(lambda: A not in gw.services.sessions)
        assert gw.services.sessions[B] is b_session  # B is untouched and still talks
        await b.listen_start("auto")
        assert_clean_turn(await b.ask(QUESTION))
        values = await metric_values(gw)
        await a.mqtt_disconnect()
        await b.close()
    assert refused(values, "topic") == 1


async def test_subscriptions_are_granted_only_for_the_devices_own_topic():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        a, b = MqttDeviceSimulator(gw.url, device_id=A), MqttDeviceSimulator(gw.url, device_id=B)
        await b.ota()
        await a.connect()
        a._write(mq.SubscribePacket.build([(a.mqtt["subscribe_topic"], 1), (b.mqtt["subscribe_topic"], 0),
                                           ("#", 0)], 7).to_bytes())  # fmt: skip
        assert await asyncio.wait_for(a.subacks.get(), 5) == [0x00, 0x80, 0x80]
        await a.listen_start("auto")
        assert_clean_turn(await a.ask(QUESTION))  # still connected
        await a.close()


async def test_qos_2_closes_and_qos_1_is_acknowledged():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        await sim.connect()
        await sim.publish('{"type":"listen","state":"start","mode":"auto"}', qos=1, packet_id=5)
        await sim.ping()  # the PUBACK came before this PINGRESP (one ordered stream)
        await sim.publish('{"type":"listen","state":"stop"}', qos=2, packet_id=6)
        await asyncio.wait_for(sim.closed.wait(), 5)
        await wait_until(lambda: sim.device_id not in gw.services.sessions)
        await sim.mqtt_disconnect()
        assert refused(await metric_values(gw), "qos") == 1


async def test_a_new_connection_of_the_same_device_replaces_the_old_one():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        first = MqttDeviceSimulator(gw.url, device_id=A)
        await first.connect()
        second = MqttDeviceSimulator(gw.url, device_id=A)
        second.mqtt = first.mqtt
        await second.connect()
        await asyncio.wait_for(first.closed.wait(), 5)
        await second.listen_start("auto")
        assert_clean_turn(await second.ask(QUESTION))
        assert gw.services.sessions[A].session_id == second.conn.session_id
        await second.close()
        await first.mqtt_disconnect()


# ---- MQTT: keepalive, size, rate, CONNECT deadline --------------------------------------------


async def test_keepalive_is_enforced_and_pings_keep_the_connection():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        pinging = MqttDeviceSimulator(gw.url, keepalive_s=1)
        silent = MqttDeviceSimulator(gw.url, keepalive_s=1)
        assert await pinging.mqtt_connect() == 0
        t0 = time.monotonic()  # before the CONNECT: the keepalive cannot have started earlier
        assert await silent.mqtt_connect(pings=False) == 0
        await asyncio.wait_for(silent.closed.wait(), 5)
        closed_after = time.monotonic() - t0
        assert pinging.mqtt_open  # its PINGREQ every second keep it
        await asyncio.sleep(1.0)
        assert pinging.mqtt_open
        await pinging.mqtt_disconnect()
        await silent.mqtt_disconnect()
        assert refused(await metric_values(gw), "keepalive") == 1
    assert 1.4 <= closed_after < 4.0  # 1.5 x keepalive


async def test_oversized_packets_floods_and_silent_sockets_are_closed():
    cfg = mqtt_config(max_packet_bytes=2048, max_packets_per_s=5, connect_timeout_s=0.5)
    async with running_gateway(cfg, backend=FakeBackend()) as gw:
        big = MqttDeviceSimulator(gw.url)
        await big.connect()
        await big.publish('{"type":"iot","x":"' + "x" * 4000 + '"}')
        await asyncio.wait_for(big.closed.wait(), 5)
        await big.mqtt_disconnect()

        flood = MqttDeviceSimulator(gw.url)
        assert await flood.mqtt_connect(pings=False) == 0
        for _ in range(60):  # bursts of 4 x 5 packets are allowed, not 60 at once
            flood._write(mq.PingReqPacket().to_bytes())
        await asyncio.wait_for(flood.closed.wait(), 5)
        await flood.mqtt_disconnect()

        host, port = "127.0.0.1", gw.app.state.mqtt.port
        t0 = time.monotonic()  # before the connect: the CONNECT deadline runs from the accept
        reader, writer = await asyncio.open_connection(host, port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed without a CONNECT
        waited = time.monotonic() - t0
        writer.close()
        values = await metric_values(gw)
    assert refused(values, "too_large") == 1 and refused(values, "rate") == 1
    assert refused(values, "connect_timeout") == 1 and 0.4 <= waited < 3


# ---- UDP: injection into another's session ------------------------------------------------


def other_socket(server: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.connect(server)
    return sock


class SeededSecrets:
    """Stands in for the `secrets` module where the UDP keys and ssrcs are drawn, so that which forged
    packets happen to pass the Opus check (about 1 in 75) is the same in every run."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def randbits(self, k: int) -> int:
        return self._random.getrandbits(k)

    def token_bytes(self, n: int) -> bytes:
        return self._random.randbytes(n)


async def test_udp_injection_with_a_wrong_key_a_replayed_sequence_or_another_address_is_dropped(monkeypatch):
    monkeypatch.setattr("gateway.xiaozhi.udp.secrets", SeededSecrets(28))
    monkeypatch.setattr("gateway.transport.udp.secrets", SeededSecrets(29))
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        victim = MqttDeviceSimulator(gw.url, device_id=B)
        hello = await victim.connect()
        await victim.listen_start("auto")  # its first packet: the session now knows its address
        server = (hello.udp.server, hello.udp.port)
        session = gw.services.sessions[B]
        channel = session.datagrams.channel
        await wait_until(lambda: channel.last_sequence == victim.local_sequence)
        home = channel.address
        base = await metric_values(gw)
        frames0 = base["xz_frames_received_total"]

        # a packet the victim sent, captured; and the ssrc, which anyone on the path sees
        captured = victim.uplink_packet(SILENT_FRAME)
        victim.send_datagram(captured)
        await wait_until(lambda: channel.last_sequence == victim.local_sequence)
        nonce = victim.keys.nonce
        attacker = other_socket(server)
        wrong = UdpCipher(random.Random(30).randbytes(16))
        for i in range(20):  # a wrong key, newer sequences: from another address and from the victim's
            header = UdpHeader(ssrc=nonce.ssrc, sequence=victim.local_sequence + 1 + i)
            attacker.send(seal(wrong, header, SILENT_FRAME))
            victim.send_datagram(seal(wrong, header, SILENT_FRAME))
        attacker.send(captured)  # replayed, from another address
        victim.send_datagram(captured)  # replayed, from the victim's own
        far = UdpHeader(ssrc=nonce.ssrc, sequence=victim.local_sequence + 1_000_000)
        victim.send_datagram(seal(UdpCipher(victim.keys.key), far, SILENT_FRAME))  # a far-future sequence
        await asyncio.sleep(0.3)
        values = await metric_values(gw)
        assert dropped(values, "address") - dropped(base, "address") == 21
        assert dropped(values, "undecryptable") - dropped(base, "undecryptable") == 20
        assert dropped(values, "late") - dropped(base, "late") == 1
        assert dropped(values, "out_of_window") - dropped(base, "out_of_window") == 1
        assert values["xz_frames_received_total"] - frames0 == 1  # only the victim's own packet
        assert channel.address == home and channel.last_sequence == victim.local_sequence

        # the victim goes on talking, and hears its reply where it is
        victim.send_audio(SILENT_FRAME)
        turn = await victim.ask(QUESTION)
        assert_clean_turn(turn)
        assert turn.frames and victim.downlink_lost == 0
        attacker.setblocking(False)
        try:
            stolen = attacker.recv(2048)
        except BlockingIOError:
            stolen = b""
        assert stolen == b""  # nothing of the reply went to the attacker
        attacker.close()
        await victim.close()


async def test_a_device_whose_address_changes_is_followed_on_a_valid_newer_packet():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("auto")
        channel = gw.services.sessions[sim.device_id].datagrams.channel
        await wait_until(lambda: channel.address is not None)
        before = channel.address
        await sim.rebind_udp()  # a new source port, as after a NAT rebinding
        assert sim.udp_address != before
        sim.send_audio(SILENT_FRAME)
        sim.send_audio(SILENT_FRAME)
        await asyncio.sleep(0.2)
        assert channel.address == before  # two valid packets do not move it yet
        sim.send_audio(SILENT_FRAME)  # the third in a row does
        await wait_until(lambda: channel.address == (sim.udp_address[0], sim.udp_address[1]))
        turn = await sim.ask(QUESTION)  # the reply reaches the new socket
        assert_clean_turn(turn)
        assert turn.frames
        assert (await metric_values(gw))["xz_udp_rebinds_total"] == 1
        await sim.close()


async def test_unknown_sessions_and_malformed_datagrams_are_dropped():
    async with running_gateway(merged(mqtt_config(), {"transport": {"udp": {"max_payload_bytes": 200}}}),
                               backend=FakeBackend()) as gw:  # fmt: skip
        sim = MqttDeviceSimulator(gw.url)
        hello = await sim.connect()
        await sim.listen_start("auto")
        server = (hello.udp.server, hello.udp.port)
        attacker = other_socket(server)
        nonce = sim.keys.nonce
        attacker.send(b"\x01short")  # under 16 bytes
        key = UdpCipher(sim.keys.key)
        packet = seal(key, UdpHeader(ssrc=nonce.ssrc, sequence=50), SILENT_FRAME)
        attacker.send(packet[:-1])  # length field does not match
        attacker.send(b"\x02" + packet[1:])  # another type
        attacker.send(seal(key, UdpHeader(ssrc=nonce.ssrc, sequence=51), b"\x58" + bytes(300)))  # too long
        attacker.send(seal(key, UdpHeader(ssrc=nonce.ssrc ^ 1, sequence=52), SILENT_FRAME))  # no such session
        await asyncio.sleep(0.3)
        values = await metric_values(gw)
        attacker.close()
        await sim.close()
    assert dropped(values, "malformed") == 4 and dropped(values, "unknown_session") == 1
