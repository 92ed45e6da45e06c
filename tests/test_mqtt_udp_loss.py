"""A weak Wi-Fi link under MQTT + UDP: 5 % of the datagrams lost and 5 % reordered, both ways (real
sockets on loopback, the loss applied at the simulated device's socket with fixed seeds).

Every turn still completes (the JSON goes over MQTT, which loses nothing); the uplink's gaps are
handed to the server's Opus concealment (counted), so a spoken utterance keeps its length and is
recognised; late packets are dropped and counted on both sides, never played out of order.
"""

from __future__ import annotations

import asyncio

from gateway.xiaozhi import AudioOut
from scripts.device_sim import LostFrames
from scripts.device_sim_mqtt import Impairment, MqttDeviceSimulator
from scripts.speech import utterance
from tests.gateway_server import running_gateway
from tests.test_listen_modes import VAD, ClipASR, durations
from tests.test_mqtt_udp_security import dropped, metric_values
from tests.test_mqtt_udp_session import assert_clean_turn, merged, mqtt_config
from tts_engine.backends.fake import FakeBackend

QUERIES = ["Tell me about the weather on the coast today.", "What should I cook for dinner tonight?",
           "Play something calm, please.", "How far away is the moon from here?"]  # fmt: skip
SPOKEN = ["What time is it now?", "Turn on the kitchen lights please, and then the radio too."]


def lossy(gw_url: str, seed: int) -> MqttDeviceSimulator:
    return MqttDeviceSimulator(gw_url, uplink=Impairment(0.05, 0.05, seed=seed),
                               downlink=Impairment(0.05, 0.05, seed=seed + 1))  # fmt: skip


async def test_text_turns_complete_with_5_percent_loss_and_reordering_both_ways():
    async with running_gateway(mqtt_config(), backend=FakeBackend(ms_per_char=30.0)) as gw:
        sim = lossy(gw.url, seed=5)
        await sim.connect()
        await sim.listen_start("auto")
        base = await metric_values(gw)
        turns = [await sim.ask(text, timeout=60) for text in QUERIES]
        await asyncio.sleep(0.3)  # a held-back last packet
        values = await metric_values(gw)
        await sim.close()
    for text, turn in zip(QUERIES, turns, strict=True):
        assert_clean_turn(turn)
        assert turn.stt == text and "".join(turn.sentences).replace(" ", "").endswith(text.replace(" ", ""))
    frames = sum(len(t.frames) for t in turns)
    sent = values["xz_udp_sent_total"] - base["xz_udp_sent_total"]
    link = sim.downlink
    assert link.dropped > 0 and link.reordered > 0
    # every packet the server sent was played, lost on the way, or arrived too late and was dropped
    assert frames + link.dropped + sim.downlink_late == sent
    assert sim.downlink_late <= link.reordered
    # gaps were concealed on the device: each turn's audio keeps the length of what was sent
    concealed = sum(r.event.packets for t in turns for r in t.records if isinstance(r.event, LostFrames))
    assert concealed == sim.downlink_lost > 0
    for turn in turns:
        gaps = sum(r.event.packets for r in turn.records if isinstance(r.event, LostFrames))
        assert turn.audio.size == (len(turn.frames) + gaps) * 960


async def test_spoken_turns_are_recognised_through_uplink_loss_with_concealment(monkeypatch):
    clips = [(text, utterance(text, lead_s=0.3, tail_s=1.0)) for text in SPOKEN]
    asr = ClipASR(durations(*clips))
    monkeypatch.setattr("gateway.services.create_asr", lambda *a, **k: asr)
    cfg = merged(mqtt_config(), {"asr": {"vad": VAD, "min_utterance_s": 0.3}})
    async with running_gateway(cfg, backend=FakeBackend(ms_per_char=20.0)) as gw:
        sim = lossy(gw.url, seed=11)
        await sim.connect()
        await sim.listen_start("auto")
        base = await metric_values(gw)
        turns = []
        for _text, clip in clips:
            t0 = asyncio.get_running_loop().time()
            sender = asyncio.create_task(sim.send_speech(clip.pcm, realtime=True))
            turns.append(await sim.collect_turn(t0, timeout=60))
            sender.cancel()
            await sim.listen_start("auto")  # as the device does after `tts stop`
        await asyncio.sleep(0.3)
        session = gw.services.sessions[sim.device_id]
        values = await metric_values(gw)
        await sim.close()
    assert [t.stt for t in turns] == SPOKEN
    for turn in turns:
        assert_clean_turn(turn)
        assert any(isinstance(r.event, AudioOut) for r in turn.records)
    lost = values["xz_udp_lost_total"] - base.get("xz_udp_lost_total", 0.0)
    late = dropped(values, "late") - dropped(base, "late")
    concealed = values["xz_udp_concealed_total"] - base.get("xz_udp_concealed_total", 0.0)
    assert sim.uplink.dropped > 0 and late > 0
    # a gap is a packet lost on the way or one that came after its successor
    assert lost == sim.uplink.dropped + late
    assert 0 < concealed <= lost
    assert session.listener.concealed_packets > 0 and session.listener.bad_packets == 0
