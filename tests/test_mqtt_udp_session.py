"""MQTT + UDP end to end (docs/mqtt-udp.md): a real gateway on loopback with its MQTT listener and UDP
endpoint, and simulated devices that speak it as the firmware does (never subscribing: every PUBLISH on
its connection is handled) or as py-xiaozhi does (paho-mqtt, subscribed). Real libopus both ways.

The session behind the transport is the WebSocket's: text and speech turns, abort, MCP tool calls,
the idle timeout and `end_conversation` end in a goodbye with the session's id, and the MQTT
connection stays up for the next hello.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np
import pytest

from gateway.xiaozhi import AudioOut, Goodbye, Stt, TtsSentenceStart, TtsStart, TtsStop
from scripts.device_sim import FIRMWARE_TOOLS, DeviceSimulator
from scripts.device_sim_mqtt import MqttDeviceSimulator, SubscribingMqttDevice
from scripts.speech import utterance
from tests.gateway_server import running_gateway
from tests.scripted_llm import answer, call, scripted_llm
from tests.test_listen_modes import VAD, ClipASR, durations
from tts_engine.backends.fake import FakeBackend

QUESTION = "What is the weather like today, please?"


def mqtt_config(**mqtt: Any) -> dict[str, Any]:
    """The listener and the UDP endpoint on free loopback ports, MQTT for every device."""
    return {
        "transport": {"mqtt": {"enabled": True, "host": "127.0.0.1", "port": 0, "all_devices": True, **mqtt},
                      "udp": {"host": "127.0.0.1", "port": 0}},  # fmt: skip
        "server": {"auth": {"secret": "mqtt-test-secret-0123456789"}},
    }


def merged(*configs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cfg in configs:
        for key, value in cfg.items():
            out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


async def wait_until(predicate, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


def assert_clean_turn(turn) -> None:
    kinds = [type(e) for e in turn.events if not isinstance(e, AudioOut)]
    assert kinds.count(TtsStart) == 1 and kinds[-1] is TtsStop


async def test_ota_sends_mqtt_only_when_enabled_and_only_to_allowed_devices():
    async with running_gateway(backend=FakeBackend()) as gw:  # off by default
        assert "mqtt" not in await DeviceSimulator(gw.url).ota()
    async with running_gateway(mqtt_config(all_devices=False, devices=["02:00:00:00:00:01"]),
                               backend=FakeBackend()) as gw:  # fmt: skip
        listed = MqttDeviceSimulator(gw.url, device_id="02:00:00:00:00:01", client_id="c-1")
        offer = (await listed.ota())["mqtt"]
        other = await DeviceSimulator(gw.url, device_id="02:00:00:00:00:02").ota()
        port = gw.app.state.mqtt.port
    assert "mqtt" not in other
    assert offer["endpoint"] == f"127.0.0.1:{port}"  # the OTA request's host and the listener's port
    async with running_gateway(mqtt_config(public_endpoint="mqtt.example.com"), backend=FakeBackend()) as gw:
        assert (await MqttDeviceSimulator(gw.url).ota())["mqtt"]["endpoint"] == "mqtt.example.com"
    assert offer["client_id"] == "xiaozhi@@@02_00_00_00_00_01"
    assert offer["publish_topic"] == "device-server/02_00_00_00_00_01"
    assert offer["subscribe_topic"] == "devices/p2p/02_00_00_00_00_01"
    assert offer["keepalive"] == 240
    assert offer["username"].startswith("xzm1.") and "mqtt-test-secret" not in str(offer)
    assert len(offer["password"]) == 43  # base64url of an HMAC-SHA256


async def test_a_firmware_like_device_holds_a_text_turn_and_closes_with_goodbye():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        hello = await sim.connect()
        assert hello.transport == "udp" and hello.udp is not None
        assert len(bytes.fromhex(hello.udp.key)) == 16 and len(bytes.fromhex(hello.udp.nonce)) == 16
        assert hello.udp.nonce.startswith("01") and hello.udp.server == "127.0.0.1"
        assert not sim.subscribes
        session = gw.services.sessions[sim.device_id]
        await sim.listen_start("auto")
        turn = await sim.ask(QUESTION)
        assert_clean_turn(turn)
        assert turn.stt == QUESTION and turn.sentences
        # every frame decodes to 60 ms at the announced rate; none lost on loopback
        assert turn.audio.size == len(turn.frames) * hello.audio_params.sample_rate * 60 // 1000
        assert np.abs(turn.audio).max() > 1000
        assert sim.downlink_lost == sim.downlink_late == sim.downlink_bad == 0
        # the timestamps carry the session's playback clock, rising through the turn
        stamps = [r.event.timestamp_ms for r in turn.frames]
        assert stamps == sorted(stamps) and stamps[-1] > stamps[0]
        await sim.close()  # goodbye with its session id, then the connection
        await wait_until(lambda: sim.device_id not in gw.services.sessions)
        assert session.listener.bad_packets == 0


def record_sends(transport: Any) -> list[str]:
    """What the server sends on an MQTT session's transport, in its order: "audio" for each UDP
    datagram, the JSON type (and state) of each message. The UDP and MQTT paths are two sockets, so
    the device may read a datagram of a burst after a message sent later; only the server's order
    says what was sent after what."""
    sent: list[str] = []
    send_audio, send_text = transport.send_audio, transport.send_text

    def audio(packet: AudioOut) -> None:
        sent.append("audio")
        send_audio(packet)

    async def text(data: str) -> None:
        message = json.loads(data)
        sent.append(" ".join(str(message[k]) for k in ("type", "state") if k in message))
        await send_text(data)

    transport.send_audio, transport.send_text = audio, text
    return sent


async def test_abort_mid_reply_ends_it_with_one_tts_stop():
    backend = FakeBackend(ms_per_char=60.0)  # a long reply
    async with running_gateway(mqtt_config(), backend=backend) as gw:
        sim = MqttDeviceSimulator(gw.url)
        await sim.connect()
        sent = record_sends(gw.services.sessions[sim.device_id].datagrams)
        await sim.listen_start("auto")
        await sim.detect("Tell me a long story about the sea and the wind and the boats.")
        await sim.next_event(AudioOut, timeout=10)
        await sim.abort()
        end = await sim.next_event(TtsStop, timeout=5)
        await asyncio.sleep(0.5)
        later = sim.drain()
        await sim.close()
    assert sent.count("tts stop") == 1
    stop = sent.index("tts stop")
    assert "audio" in sent[:stop] and "audio" not in sent[stop:]  # nothing sent after the stop
    assert not [r for r in later if isinstance(r.event, TtsStop)]
    # what the device read after the stop are datagrams of the last burst, sent before it
    late = [r for r in later if isinstance(r.event, AudioOut) and r.t > end.t]
    assert len(late) < sent[:stop].count("audio")


async def test_a_spoken_turn_over_udp_is_recognised_and_answered(monkeypatch):
    question = utterance("What time is it now?", lead_s=0.3, tail_s=1.0)
    asr = ClipASR(durations(("What time is it now?", question)))
    monkeypatch.setattr("gateway.services.create_asr", lambda *a, **k: asr)
    cfg = merged(mqtt_config(), {"asr": {"vad": VAD, "min_utterance_s": 0.3}})
    async with running_gateway(cfg, backend=FakeBackend(ms_per_char=20.0)) as gw:
        sim = MqttDeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("auto")
        t0 = asyncio.get_running_loop().time()
        sender = asyncio.create_task(sim.send_speech(question.pcm, realtime=True))
        turn = await sim.collect_turn(t0, timeout=30)
        sender.cancel()
        session = gw.services.sessions[sim.device_id]
        await sim.close()
    assert turn.stt == "What time is it now?"
    assert_clean_turn(turn)
    assert turn.frames and len(asr.calls) == 1
    assert session.listener.bad_packets == 0


async def test_an_mcp_tool_call_reaches_the_device_over_mqtt():
    set_volume = "self_audio_speaker_set_volume"
    async with scripted_llm(call(set_volume, '{"volume": 30}'), answer("好的，音量调到三十了。")) as llm:
        llm_cfg = {"llm": {"provider": "openai", "base_url": llm.base_url, "api_key": "", "model": "m"},
                   "session": {"enable_greeting": False}}  # fmt: skip
        async with running_gateway(merged(mqtt_config(), llm_cfg), backend=FakeBackend()) as gw:
            sim = MqttDeviceSimulator(gw.url, mcp_tools=FIRMWARE_TOOLS)
            await sim.connect()
            await sim.listen_start("auto")
            turn = await sim.ask("把音量调到30")
            await sim.close()
    assert sim.mcp.calls == [("self.audio_speaker.set_volume", {"volume": 30})]
    assert sim.mcp.volume == 30
    assert "".join(turn.sentences) == "好的，音量调到三十了。"
    assert_clean_turn(turn)


async def test_end_conversation_says_goodbye_and_the_connection_serves_the_next_hello():
    async with scripted_llm(call("end_conversation", "{}"), answer("再见！")) as llm:
        llm_cfg = {"llm": {"provider": "openai", "base_url": llm.base_url, "api_key": "", "model": "m"},
                   "session": {"enable_greeting": False}}  # fmt: skip
        async with running_gateway(merged(mqtt_config(), llm_cfg), backend=FakeBackend()) as gw:
            sim = MqttDeviceSimulator(gw.url)
            first = await sim.connect()
            await sim.listen_start("auto")
            turn = await sim.ask("再见")
            await asyncio.wait_for(sim.goodbye.wait(), 10)  # with our session id: the firmware honours it
            assert_clean_turn(turn)
            await wait_until(lambda: sim.device_id not in gw.services.sessions)
            # the MQTT connection stays: the next conversation is a new hello on it
            assert sim.mqtt_open
            await sim.ping()
            second = await sim.connect()
            assert second.session_id != first.session_id
            assert second.udp is not None and first.udp is not None and second.udp.key != first.udp.key
            await sim.listen_start("auto")
            assert gw.services.sessions[sim.device_id].session_id == second.session_id
            await sim.close()


async def test_the_idle_timeout_ends_the_session_with_goodbye():
    cfg = merged(mqtt_config(), {"session": {"idle_no_voice_s": 0.6, "idle_hard_s": 0.6}})
    async with running_gateway(cfg, backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        await sim.connect()
        await asyncio.wait_for(sim.goodbye.wait(), 10)
        await wait_until(lambda: sim.device_id not in gw.services.sessions)
        assert sim.mqtt_open
        await sim.mqtt_disconnect()


async def test_a_goodbye_for_another_session_id_is_ignored():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        hello = await sim.connect()
        await sim.publish('{"session_id":"not-this-one","type":"goodbye"}')
        await sim.listen_start("auto")
        turn = await sim.ask(QUESTION)  # the session is still there
        assert_clean_turn(turn)
        assert gw.services.sessions[sim.device_id].session_id == hello.session_id
        await sim.close()


async def test_a_subscribing_py_xiaozhi_style_client_works():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = SubscribingMqttDevice(gw.url)
        await sim.connect()
        assert sim.granted == [0]  # its subscription to its own topic, granted at QoS 0
        await sim.listen_start("auto")
        turn = await sim.ask(QUESTION)
        assert_clean_turn(turn)
        assert turn.frames and sim.downlink_lost == 0
        session = gw.services.sessions[sim.device_id]
        assert session.listener.bad_packets == 0
        await sim.close()
        await wait_until(lambda: sim.device_id not in gw.services.sessions)


async def test_a_websocket_session_of_the_same_device_is_replaced_by_its_mqtt_hello():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        ws = DeviceSimulator(gw.url, device_id="02:00:00:00:aa:01")
        await ws.connect()
        mqtt = MqttDeviceSimulator(gw.url, device_id="02:00:00:00:aa:01")
        await mqtt.connect()
        await asyncio.wait_for(ws.closed.wait(), 10)
        assert gw.services.sessions["02:00:00:00:aa:01"].datagrams is not None
        await mqtt.close()
        await ws.close()


async def test_metrics_count_mqtt_and_udp_traffic():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("auto")
        turn = await sim.ask(QUESTION)
        await sim.close()
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"{gw.url}/metrics")).text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith("xz_") and " " in line}  # fmt: skip
    assert values["xz_udp_sent_total"] == len(turn.frames)
    assert values["xz_udp_received_total"] >= 1
    assert values["xz_mqtt_messages_total{direction=\"in\"}"] >= 3  # hello, listen, detect
    assert values["xz_mqtt_messages_total{direction=\"out\"}"] >= 5


@pytest.mark.parametrize("goodbye", [True, False])
async def test_the_device_leaving_ends_the_session(goodbye: bool):
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        await sim.connect()
        assert sim.device_id in gw.services.sessions
        if goodbye:
            await sim.send(Goodbye())
        else:
            await sim.mqtt_disconnect()  # the connection drops without a goodbye
        await wait_until(lambda: sim.device_id not in gw.services.sessions)
        await sim.mqtt_disconnect()
    assert not any(isinstance(e, Goodbye) for e in (r.event for r in sim.records))  # none sent back


async def test_messages_before_hello_and_unknown_types_are_dropped_not_fatal():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        assert await sim.mqtt_connect() == 0
        await sim.publish('{"type":"listen","state":"start","mode":"auto"}')  # no session yet
        await sim.publish("not json")
        await sim.publish('{"type":"hello"')
        await sim.connect()
        await sim.publish('{"type":"iot","update":true}')
        await sim.listen_start("auto")
        turn = await sim.ask(QUESTION)
        assert_clean_turn(turn)
        assert isinstance(turn.events[0], Stt | TtsStart | TtsSentenceStart)
        await sim.close()


def self_signed(tmp_path) -> tuple[str, str]:
    """A certificate and key for 127.0.0.1, made here (cryptography's x509 builder)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = tmp_path / "mqtt.crt", tmp_path / "mqtt.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return str(cert_path), str(key_path)


async def test_the_listener_speaks_tls_with_a_certificate(tmp_path):
    cert, key = self_signed(tmp_path)
    async with running_gateway(mqtt_config(tls_cert=cert, tls_key=key), backend=FakeBackend()) as gw:
        plain = MqttDeviceSimulator(gw.url, tls=False)
        await plain.ota()
        with pytest.raises((ConnectionError, TimeoutError, OSError)):
            await plain.mqtt_connect(timeout=3)  # plain MQTT to a TLS port gets nowhere
        await plain.mqtt_disconnect()
        sim = MqttDeviceSimulator(gw.url, tls=True)
        await sim.connect()
        await sim.listen_start("auto")
        assert_clean_turn(await sim.ask(QUESTION))
        await sim.close()


async def test_shutdown_ends_live_mqtt_sessions_with_goodbye():
    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("auto")
    # the gateway has stopped: the device was told goodbye and its connection closed
    await asyncio.wait_for(sim.goodbye.wait(), 5)
    await asyncio.wait_for(sim.closed.wait(), 5)
    await sim.mqtt_disconnect()


def test_tls_needs_both_files():
    from gateway.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="tls_cert and tls_key"):
        load_config(environ={}, overrides={"transport": {"mqtt": {"enabled": True, "tls_cert": "a.pem"}}})
    with pytest.raises(ConfigError, match="public_endpoint"):
        load_config(environ={}, overrides={"transport": {"mqtt": {"public_endpoint": "mqtt://x:1883"}}})


async def test_an_aec_device_echoes_the_udp_timestamps_and_the_canceller_aligns_on_them():
    from scripts.device_sim_mqtt import SILENT_FRAME

    async with running_gateway(mqtt_config(), backend=FakeBackend()) as gw:
        sim = MqttDeviceSimulator(gw.url)
        await sim.connect(features={"mcp": False, "aec": True})  # a CONFIG_USE_SERVER_AEC build
        session = gw.services.sessions[sim.device_id]
        assert session.echo is not None
        await sim.listen_start("realtime")
        received: list[int] = []

        def playing(frame: AudioOut) -> None:
            # as the firmware does in realtime mode: its microphone streams on while it plays, each
            # uplink packet stamped with the timestamp of the packet just played (5 behind: the pre-buffer)
            received.append(frame.timestamp_ms)
            if len(received) > 5:
                sim.send_audio(SILENT_FRAME, received[-6])

        sim.on_audio = playing
        turn = await sim.ask(QUESTION)
        assert_clean_turn(turn)
        assert received[0] > 0
        await wait_until(lambda: session.echo.stats().aligned_by_timestamps)
        await sim.close()
