"""Server-side AEC in a real gateway over loopback: barge-in on a single-mic device.

The simulated device (scripts/echo_path.EchoDevice) plays our espeak-ng reply
and hears it through a synthetic echo path; its microphone goes back at real
time, with v2 timestamps or (v1) without. Recognition is the clip-naming
stand-in of tests/test_listen_modes.py (the tiny FunASR model cannot recognise
real speech), so "recognised text intact" means: the utterance the recogniser
got has the duration of the user's words, not of the echo. The default
configuration: AEC3 with the double-talk stage (asr.aec_double_talk).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.xiaozhi import AudioOut, Stt, TtsSentenceStart, TtsStart, TtsStop
from scripts.device_sim import DeviceSimulator
from scripts.echo_path import EchoDevice, EchoPath
from scripts.speech import utterance
from tests.gateway_server import running_gateway
from tests.test_listen_modes import ClipASR, LongLLM, durations, use_asr  # noqa: F401 (fixture)
from tts_engine.backends.espeak import EspeakBackend

VAD = {"min_silence_ms": 400, "min_speech_ms": 160, "pre_roll_ms": 300, "detect_mute_s": 0.0}
QUERY = "Tell me a story please."
SAID = "Stop, tell me the time instead."


def gateway(llm: LongLLM | None = None):
    cfg = {"asr": {"vad": VAD, "min_utterance_s": 0.3}}
    return running_gateway(cfg, backend=EspeakBackend(), llm=llm or LongLLM())


async def reply_over_echo(
    gw, *, version: int, seconds: float, near=None, near_at_s: float = 0.0, then: type | None = None
):
    """A typed query, then `seconds` of microphone audio while the reply plays; then the next `then`
    event (within 10 s) or, without one, half a second of whatever else comes."""
    sim = DeviceSimulator(gw.url, protocol_version=version)
    await sim.connect(features={"aec": True})
    device = EchoDevice(sim, EchoPath(delay_ms=150, gain_db=-10), timestamps=version == 2)
    await sim.listen_start("realtime")
    await sim.detect(QUERY)
    await sim.next_event(AudioOut, timeout=10)
    t0 = await device.talk(seconds, near=near, near_at_s=near_at_s)
    if then is None:
        await asyncio.sleep(0.5)
    else:
        await sim.next_event(then, timeout=10)
    await sim.close()
    return sim, t0


async def session_ended(gw, name: str, timeout: float = 3.0) -> float | None:
    registry = gw.services.metrics.registry
    deadline = time.monotonic() + timeout
    while not (value := registry.get_sample_value(name)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return value


@pytest.mark.parametrize("version", [2, 1], ids=["v2-timestamps", "v1-estimated"])
async def test_echo_alone_never_barges_in(use_asr, version):  # noqa: F811
    asr = use_asr(ClipASR({QUERY: 1.0}))
    async with gateway() as gw:
        sim, _ = await reply_over_echo(gw, version=version, seconds=7.0)
        count = await session_ended(gw, "xz_aec_erle_db_count")
        erle_sum = gw.services.metrics.registry.get_sample_value("xz_aec_erle_db_sum")
        aborted = gw.services.metrics.registry.get_sample_value("xz_turns_aborted_total")
        alignment = "timestamps" if version == 2 else "estimated"
        aligned = gw.services.metrics.registry.get_sample_value(
            "xz_aec_sessions_total", {"alignment": alignment}
        )
    assert asr.calls == []  # the echo was never taken for speech
    assert not [r for r in sim.records if isinstance(r.event, TtsStop)]  # the reply played on
    assert [r.event.text for r in sim.records if isinstance(r.event, Stt)] == [QUERY]
    assert aborted == 0
    assert count == 1 and erle_sum >= 20
    assert aligned == 1  # a v2 device's timestamps were used (its stamps trail the frames it sends)


@pytest.mark.parametrize("version", [2, 1], ids=["v2-timestamps", "v1-estimated"])
async def test_user_talking_over_the_reply_barges_in(use_asr, version):  # noqa: F811
    said = utterance(SAID, lead_s=0.0, tail_s=0.0)
    asr = use_asr(ClipASR(durations((SAID, said), ("echo", utterance(QUERY * 3, lead_s=0, tail_s=0)))))
    llm = LongLLM()
    async with gateway(llm) as gw:
        # until the new turn's tts start (the reply's came before its audio)
        sim, t0 = await reply_over_echo(
            gw, version=version, seconds=7.0, near=said.pcm, near_at_s=3.5, then=TtsStart
        )
    t_onset = t0 + 3.5
    records = sim.records
    stop = next(r for r in records if isinstance(r.event, TtsStop))
    stt = next(r for r in records if isinstance(r.event, Stt) and r.event.text != QUERY)
    assert 0 < stop.t - t_onset < 0.8  # stopped while the user was still talking
    assert stt.t > stop.t and stt.event.text == SAID
    assert len(asr.calls) == 1  # one utterance recognised: the user's, nothing made of echo
    between = [r for r in records if stop.t < r.t < stt.t]
    assert not [r for r in between if isinstance(r.event, AudioOut | TtsSentenceStart | TtsStart)]
    assert isinstance(records[records.index(stt) + 1].event, TtsStart)  # the new turn follows
    assert llm.calls == [QUERY, SAID]
