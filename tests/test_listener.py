"""The per-session listener: Opus packets in, utterances (with pre-roll) out."""

from __future__ import annotations

import numpy as np
import pytest

from audio_codecs.opus import OpusEncoder
from gateway.config import VADConfig
from gateway.device.listener import Listener, UtteranceEnded, UtteranceStarted
from scripts.speech import RATE, utterance


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def packets(pcm: np.ndarray) -> list[bytes]:
    encoder = OpusEncoder(RATE, 60)
    return encoder.encode(pcm) + encoder.flush()


def feed(listener: Listener, pcm: np.ndarray) -> list:
    events = []
    for packet in packets(pcm):
        events += listener.push(packet)
    return events


def correlate(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-9))


@pytest.mark.parametrize("pre_roll_ms", [0, 300])
def test_utterance_audio_has_the_pre_roll_and_the_whole_speech(pre_roll_ms: int):
    cfg = VADConfig(pre_roll_ms=pre_roll_ms, min_silence_ms=400)
    truth = utterance("Please turn on the kitchen light.", lead_s=1.0, tail_s=1.0, noise_dbfs=-50)
    events = feed(Listener(cfg), truth.pcm)
    assert [type(e) for e in events] == [UtteranceStarted, UtteranceEnded]
    started, ended = events
    assert started.start_s == ended.start_s
    assert abs(ended.start_s - truth.start_s) <= 0.1 and abs(ended.end_s - truth.end_s) <= 0.1
    # the audio runs from pre-roll before the detected start to the decision point
    first = int(ended.start_s * RATE) - pre_roll_ms * RATE // 1000
    assert ended.pcm.size >= truth.end - first
    assert ended.pcm.size <= truth.end - first + (400 + 300) * RATE // 1000
    # it is the speech itself (the codec adds ~6.5 ms of delay: align on the best lag)
    reference = truth.pcm[first : first + ended.pcm.size].astype(np.float64)
    best = max(correlate(np.roll(ended.pcm, -lag)[:-200], reference[:-200]) for lag in range(0, 200, 4))
    assert best > 0.9
    if pre_roll_ms:
        # the first syllable is inside: speech energy begins after some pre-roll samples
        head = np.abs(ended.pcm[: pre_roll_ms * RATE // 2000].astype(np.int32)).max()
        assert head < 1000


def test_two_utterances_and_nothing_kept_between_them():
    cfg = VADConfig(min_silence_ms=300, pre_roll_ms=200)
    truth = utterance(["Turn on the light.", "Play some music."], gap_s=1.5, lead_s=0.5, tail_s=1.0)
    listener = Listener(cfg)
    events = feed(listener, truth.pcm)
    ends = [e for e in events if isinstance(e, UtteranceEnded)]
    assert len(ends) == 2
    # each utterance's audio is about its own speech, not both
    assert all(e.pcm.size < (e.end_s - e.start_s + 0.2 + 0.3 + 0.2) * RATE for e in ends)
    assert ends[1].start_s - ends[0].end_s > 1.3


def test_silence_gives_no_events_and_keeps_little_audio():
    listener = Listener(VADConfig(pre_roll_ms=300))
    assert feed(listener, np.zeros(RATE * 5, np.int16)) == []
    assert listener.take().size == 0


def test_manual_mode_keeps_everything_up_to_the_bound():
    listener = Listener(VADConfig(), max_utterance_s=2.0)
    listener.reset(endpointing=False)
    truth = utterance(["One.", "Two."], gap_s=1.0)
    assert feed(listener, truth.pcm) == []  # no endpointing in manual mode
    pcm = listener.take()
    assert pcm.size == pytest.approx(2.0 * RATE, abs=960)  # the oldest audio was dropped
    assert listener.dropped_samples > 0
    assert listener.take().size == 0  # take empties


def test_manual_mode_short_enough_is_whole():
    listener = Listener(VADConfig(), max_utterance_s=60)
    listener.reset(endpointing=False)
    truth = utterance("Hello there.", lead_s=0.3, tail_s=0.3)
    feed(listener, truth.pcm)
    pcm = listener.take()
    assert abs(pcm.size - truth.pcm.size) < 960 and listener.dropped_samples == 0


def test_take_in_auto_mode_gives_the_utterance_in_progress():
    listener = Listener(VADConfig(pre_roll_ms=200))
    truth = utterance("This sentence is cut short", lead_s=0.5, tail_s=0.0)
    events = feed(listener, truth.pcm)
    assert [type(e) for e in events] == [UtteranceStarted]
    pcm = listener.take()
    assert pcm.size >= (truth.end - truth.start) * 0.9
    assert listener.take().size == 0


def test_long_speech_is_cut_at_the_utterance_bound():
    listener = Listener(VADConfig(), max_utterance_s=1.5)
    truth = utterance(["The quick brown fox jumps over the lazy dog."] * 2, gap_s=0.05, lead_s=0.3)
    events = feed(listener, truth.pcm)
    ends = [e for e in events if isinstance(e, UtteranceEnded)]
    assert len(ends) >= 2
    assert all(e.speech_s <= 1.5 + 0.05 for e in ends[:-1])


def test_mute_drops_audio_for_a_while():
    clock = FakeClock()
    listener = Listener(VADConfig(), clock=clock)
    speech = utterance("Hello, what is the weather?", lead_s=0.3, tail_s=1.0).pcm
    listener.mute(2.0)
    assert feed(listener, speech) == []
    assert listener.position_s == 0.0
    clock.now += 2.5
    events = feed(listener, speech)
    assert [type(e) for e in events] == [UtteranceStarted, UtteranceEnded]


def test_bad_and_empty_packets_are_dropped():
    listener = Listener(VADConfig())
    assert listener.push(b"") == []
    assert listener.push(b"\xff\xff\xff\xff\xff") == []
    assert listener.bad_packets == 1
    events = feed(listener, utterance("Still working?", tail_s=1.0).pcm)
    assert [type(e) for e in events] == [UtteranceStarted, UtteranceEnded]
