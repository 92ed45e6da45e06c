"""Loopback integration of speech input in every listen mode (protocol §9 b-d, checklist 22-26).

Real uvicorn, the device simulator streaming Opus speech (espeak-ng), the real
Silero VAD, the fake TTS backend. Recognition is a stand-in that names which of
the test's clips it was given (by the duration of the speech in the audio it
receives); tests/test_asr_funasr.py runs the real FunASR code path in a
gateway.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from gateway.xiaozhi import AudioOut, Stt, TtsSentenceStart, TtsStart, TtsStop
from scripts.device_sim import DeviceSimulator
from scripts.speech import RATE, speech_bounds, utterance
from tests.gateway_server import running_gateway
from tts_engine.backends.fake import FakeBackend

VAD = {"min_silence_ms": 400, "min_speech_ms": 160, "pre_roll_ms": 300, "detect_mute_s": 0.6}


class ClipASR:
    """Names the clip whose speech duration is nearest to the speech in the audio."""

    name = "clips"

    def __init__(self, clips: dict[str, float], delay_s: float = 0.05) -> None:
        self.clips = clips
        self.delay_s = delay_s
        self.calls: list[float] = []  # speech seconds heard per call

    async def transcribe(self, pcm16k: np.ndarray) -> str:
        x = pcm16k.astype(np.float32) / 32768
        start, end = speech_bounds(x)
        heard = (end - start) / RATE
        self.calls.append(heard)
        await asyncio.sleep(self.delay_s)
        return min(self.clips, key=lambda text: abs(self.clips[text] - heard))

    async def aclose(self) -> None:
        return None


class LongLLM:
    """A reply long enough to be talked over; later calls answer briefly."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def stream_chat(self, messages):
        self.calls.append(messages[-1]["content"])
        text = (
            "This is a long story that keeps going for quite a while. " * 4 if len(self.calls) == 1 else "OK."
        )
        for word in text.split(" "):
            yield word + " "


def clip(text: str, **kw):
    return utterance(text, lead_s=kw.pop("lead_s", 0.3), tail_s=kw.pop("tail_s", 0.8), **kw)


def durations(*clips) -> dict[str, float]:
    return {text: (u.end - u.start) / RATE for text, u in clips}


def gateway(asr, *, llm=None, **asr_cfg):
    cfg = {"asr": {"vad": VAD, "min_utterance_s": 0.3, **asr_cfg}}
    return running_gateway(cfg, backend=FakeBackend(ms_per_char=20.0), llm=llm)


@pytest.fixture
def use_asr(monkeypatch):
    """Services.build gets this recognizer instead of the configured one."""

    def install(asr):
        monkeypatch.setattr("gateway.services.create_asr", lambda *a, **kw: asr)
        return asr

    return install


def kinds(turn) -> list[type]:
    return [type(e) for e in turn.events if not isinstance(e, AudioOut)]


async def test_auto_mode_endpoints_and_answers(use_asr):
    weather = clip("What is the weather like today?")
    asr = use_asr(
        ClipASR(durations(("What is the weather like today?", weather), ("Good night.", clip("Good night."))))
    )
    async with gateway(asr) as gw:
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("auto")
        t0 = time.monotonic()
        await sim.send_speech(weather.pcm, realtime=True)
        t_speech_end = t0 + weather.end_s
        turn = await sim.collect_turn(t_speech_end, timeout=10)
        # after the reply the device listens again; silence and noise give nothing (checklist 24)
        await sim.listen_start("auto")
        rng = np.random.default_rng(0)
        await sim.send_speech((rng.standard_normal(RATE) * 300).astype(np.int16))
        await asyncio.sleep(0.6)
        await sim.close()
    assert turn.stt == "What is the weather like today?"
    assert kinds(turn)[:2] == [Stt, TtsStart] and kinds(turn)[-1] == TtsStop
    assert "What is the weather like today?" in " ".join(turn.sentences)
    t_stt = turn.time_of(Stt)
    assert t_stt - t_speech_end < 1.0  # min_silence (0.4 s) + recognition: within ~1 s (checklist 23)
    assert t_stt - t_speech_end > 0.2  # it waited for the silence
    assert len(asr.calls) == 1
    assert not [r for r in sim.records if r.t > turn.records[-1].t and not isinstance(r.event, AudioOut)]


async def test_manual_mode_recognises_everything_at_listen_stop(use_asr):
    whole = utterance(["Turn on the light.", "And play some music."], gap_s=1.2, lead_s=0.3, tail_s=0.3)
    part = clip("Turn on the light.")
    asr = use_asr(
        ClipASR({"both": (whole.end - whole.start) / RATE, "first": (part.end - part.start) / RATE})
    )
    async with gateway(asr) as gw:
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("manual")
        await sim.send_speech(whole.pcm)
        await asyncio.sleep(0.3)
        before_stop = [r for r in sim.records if not isinstance(r.event, AudioOut)][1:]  # after the hello
        t_stop = time.monotonic()
        await sim.listen_stop()
        turn = await sim.collect_turn(t_stop, timeout=10)
        await sim.close()
    assert before_stop == []  # no VAD cut-off at the 1.2 s pause (checklist 25)
    assert turn.stt == "both" and asr.calls and len(asr.calls) == 1
    assert kinds(turn)[:2] == [Stt, TtsStart]


async def talk_over_reply(
    aec: bool, spoken: str, heard_as: str, use_asr, *, realtime: bool = True, server_aec: str = "auto"
):
    """A spoken query, then the user says `spoken` while the long reply plays (realtime mode)."""
    query = clip("Tell me a story please.")
    interruption = clip(spoken, lead_s=0.2)
    asr = use_asr(ClipASR(durations(("Tell me a story please.", query), (heard_as, interruption))))
    llm = LongLLM()
    async with gateway(asr, llm=llm, aec=server_aec) as gw:
        sim = DeviceSimulator(gw.url)
        await sim.connect(features={"aec": aec})
        await sim.listen_start("realtime")
        await sim.send_speech(query.pcm)
        first = await sim.next_event(AudioOut, timeout=10)
        await asyncio.sleep(0.3)  # the reply is playing
        t0 = time.monotonic()
        await sim.send_speech(interruption.pcm, realtime=realtime)
        t_onset, t_end = t0 + interruption.start_s, t0 + interruption.end_s
        await asyncio.sleep(0.8)
        t_close = time.monotonic()
        await sim.close()
    return sim, first.t, t_onset, t_end, t_close, llm


async def test_realtime_aec_device_with_server_aec_off_waits_for_recognition(use_asr):
    # `features.aec` asks the SERVER to cancel echo (firmware CONFIG_USE_SERVER_AEC). With asr.aec
    # off nobody does, so speech heard over the reply may be its echo: no barge-in at speech onset.
    # Barge-in at onset with the server's AEC on: tests/test_aec_session.py.
    said = "Stop, tell me the time instead."
    sim, t_first, t_onset, t_end, _, llm = await talk_over_reply(True, said, said, use_asr, server_aec="off")
    records = [r for r in sim.records if r.t > t_first]
    stop = next(r for r in records if isinstance(r.event, TtsStop))
    stt = next(r for r in records if isinstance(r.event, Stt))
    assert stop.t > t_end + 0.3  # the reply went on until the utterance was over and recognised
    assert stt.t >= stop.t and stt.event.text == "Stop, tell me the time instead."
    assert llm.calls == ["Tell me a story please.", "Stop, tell me the time instead."]


async def test_realtime_without_aec_stops_only_for_recognised_speech(use_asr):
    said = "What time is it now?"
    sim, t_first, t_onset, t_end, _, llm = await talk_over_reply(False, said, said, use_asr)
    records = [r for r in sim.records if r.t > t_first]
    stop = next(r for r in records if isinstance(r.event, TtsStop))
    stt = next(r for r in records if isinstance(r.event, Stt))
    assert stop.t > t_end + 0.3  # the reply went on until the utterance was over and recognised
    assert stt.t >= stop.t and stt.event.text == "What time is it now?"  # tts stop first (checklist 26)
    # speech recognised as nothing (empty text) does not cut a reply
    sim2, t_first2, _, _, t_close2, _ = await talk_over_reply(
        False, "Hmm, well.", "", use_asr, realtime=False
    )
    late = [r for r in sim2.records if r.t > t_close2 - 0.4]  # still playing when the device hung up
    assert any(isinstance(r.event, AudioOut) for r in late)
    assert not [r for r in sim2.records if r.t > t_first2 and isinstance(r.event, Stt)]


async def test_wake_word_audio_is_not_a_query(use_asr):
    wake = utterance("你好小智", voice="cmn", lead_s=0.2, tail_s=0.6)
    query = clip("What can you do?")
    asr = use_asr(ClipASR(durations(("你好小智", wake), ("What can you do?", query)), delay_s=0.3))
    async with gateway(asr) as gw:
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("auto")
        await sim.send_speech(wake.pcm)  # the wake-word burst, faster than real time
        t_detect = await sim.detect("你好小智")
        await sim.listen_start("auto")
        await sim.send_speech(query.pcm)  # within detect_mute_s: the wake word's tail, ignored
        greeting = await sim.collect_turn(t_detect, timeout=10)
        await asyncio.sleep(0.7)  # the mute is over
        await sim.listen_start("auto")
        t_query = time.monotonic()
        await sim.send_speech(query.pcm)
        answer = await sim.collect_turn(t_query, timeout=10)
        await sim.close()
    assert kinds(greeting) == [TtsStart, TtsSentenceStart, TtsStop]
    assert [r.event.text for r in sim.records if isinstance(r.event, Stt)] == ["What can you do?"]
    assert answer.stt == "What can you do?"


async def test_sessions_do_not_hear_each_other(use_asr):
    texts = ["Hello.", "What is the weather like in Beijing today?", "Play my favourite song please."]
    clips = {text: clip(text) for text in texts}
    asr = use_asr(ClipASR(durations(*clips.items())))
    async with gateway(asr) as gw:
        sims = [DeviceSimulator(gw.url) for _ in texts]
        for sim in sims:
            await sim.connect()
            await sim.listen_start("auto")

        async def talk(sim: DeviceSimulator, text: str):
            t = time.monotonic()
            await sim.send_speech(clips[text].pcm)
            return await sim.collect_turn(t, timeout=15)

        turns = await asyncio.gather(*(talk(s, t) for s, t in zip(sims, texts, strict=True)))
        await asyncio.sleep(0.3)
        for sim in sims:
            await sim.close()
    for sim, text, turn in zip(sims, texts, turns, strict=True):
        assert [r.event.text for r in sim.records if isinstance(r.event, Stt)] == [text]
        assert text in " ".join(turn.sentences)
    assert len(asr.calls) == 3
