"""Silero VAD and endpointing on real speech (espeak-ng through an Opus round trip)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from audio_codecs.opus import OpusDecoder, OpusEncoder
from gateway.asr.vad import (
    WINDOW,
    Endpointer,
    SileroVAD,
    SpeechEnd,
    SpeechStart,
    VADInputError,
    VoiceActivityDetector,
    find_silero_model,
)
from gateway.config import VADConfig
from scripts.speech import RATE, utterance

TOLERANCE_S = 0.1


def opus_frames(pcm: np.ndarray) -> list[np.ndarray]:
    """What the gateway decodes from a device's 60 ms uplink packets."""
    encoder, decoder = OpusEncoder(RATE, 60), OpusDecoder(RATE)
    return [decoder.decode(p) for p in encoder.encode(pcm) + encoder.flush()]


def detect(pcm: np.ndarray, cfg: VADConfig | None = None) -> list[SpeechStart | SpeechEnd]:
    vad = VoiceActivityDetector(cfg or VADConfig())
    events = []
    for frame in opus_frames(pcm):
        events += vad.feed(frame)
    return events


CASES = [
    ("The weather is fine today. Let us go for a walk in the park!", "en"),
    ("What time is it?", "en"),
    ("今天天气很好，我们去公园散步吧。", "cmn"),
    ("你好小智", "cmn"),
]


@pytest.mark.parametrize("noise_dbfs", [None, -50.0, -35.0])
@pytest.mark.parametrize(("text", "voice"), CASES)
def test_utterance_boundaries_within_100_ms(text: str, voice: str, noise_dbfs: float | None):
    truth = utterance(text, voice=voice, lead_s=1.0, tail_s=1.5, noise_dbfs=noise_dbfs)
    events = detect(truth.pcm)
    assert [type(e) for e in events] == [SpeechStart, SpeechEnd]
    start, end = events
    assert start.start == end.start
    assert abs(end.start / RATE - truth.start_s) <= TOLERANCE_S
    assert abs(end.end / RATE - truth.end_s) <= TOLERANCE_S


def test_a_long_pause_splits_and_a_short_one_does_not():
    cfg = VADConfig(min_silence_ms=400)
    two = utterance(["Turn on the light.", "And play some music."], gap_s=1.0, noise_dbfs=-50)
    one = utterance(["Turn on the light.", "And play some music."], gap_s=0.15, noise_dbfs=-50)
    assert [type(e) for e in detect(two.pcm, cfg)] == [SpeechStart, SpeechEnd] * 2
    events = detect(one.pcm, cfg)
    assert [type(e) for e in events] == [SpeechStart, SpeechEnd]
    assert abs(events[1].end / RATE - one.end_s) <= TOLERANCE_S


def test_silence_and_noise_alone_are_not_speech():
    rng = np.random.default_rng(1)
    quiet = np.zeros(RATE * 3, np.int16)
    noise = (rng.standard_normal(RATE * 3) * 10 ** (-35 / 20) * 32767).astype(np.int16)
    hum = (np.sin(2 * np.pi * 50 * np.arange(RATE * 3) / RATE) * 3000).astype(np.int16)
    for pcm in (quiet, noise, hum):
        assert detect(pcm) == []


def test_chunking_does_not_change_the_probabilities():
    pcm = utterance("Hello there, how are you?").pcm
    model = SileroVAD.shared()
    whole = model.stream().push(pcm)
    stream = model.stream()
    pieces: list[float] = []
    for size in (1, 511, 512, 513, 960, 3000):
        pieces += stream.push(pcm[:size])
        pcm_rest = pcm[size:]
        pcm = pcm_rest
    pieces += stream.push(pcm)
    assert len(whole) == len(pieces) == stream.windows
    np.testing.assert_allclose(whole, pieces, atol=1e-5)
    assert max(whole) > 0.9 and min(whole) < 0.1


def test_reset_forgets_the_state():
    speech = utterance("Good morning everyone.", lead_s=0.0, tail_s=0.0).pcm
    model = SileroVAD.shared()
    fresh = model.stream().push(speech[: WINDOW * 4])
    stream = model.stream()
    stream.push(speech)
    stream.reset()
    assert stream.push(speech[: WINDOW * 4]) == pytest.approx(fresh, abs=1e-6)


def endpoint(probs: list[float], **cfg) -> list[tuple[str, float, float]]:
    ep = Endpointer(VADConfig(**cfg), window=160)  # 10 ms windows keep the arithmetic readable
    out = []
    for p in probs:
        event = ep.push(p)
        if isinstance(event, SpeechStart):
            out.append(("start", event.start / RATE, 0.0))
        elif isinstance(event, SpeechEnd):
            out.append(("end", event.start / RATE, event.end / RATE))
    return out


def test_endpointer_hysteresis_and_minimum_durations():
    kw = {"threshold": 0.5, "threshold_low": 0.3, "min_speech_ms": 50, "min_silence_ms": 100}
    # 0.4 is between the thresholds: it neither starts speech nor ends it
    assert endpoint([0.4] * 50, **kw) == []
    probs = [0.0] * 10 + [0.9] * 10 + [0.4] * 30 + [0.1] * 20
    events = endpoint(probs, **kw)
    assert [e[0] for e in events] == ["start", "end"]
    # the start is back-dated to the first voiced window; confirmed after min_speech
    assert events[0][1] == pytest.approx(0.1)
    # the end is the last window above `threshold` (0.2 s) less the model lag
    assert events[1][2] == pytest.approx(0.2 - 2 * 160 / RATE)
    # a blip shorter than min_speech is dropped
    assert endpoint([0.0] * 5 + [0.9] * 3 + [0.0] * 30, **kw) == []
    # a dip shorter than min_silence does not split, a new voiced window cancels it
    merged = endpoint([0.9] * 10 + [0.1] * 8 + [0.9] * 10 + [0.0] * 20, **kw)
    assert [e[0] for e in merged] == ["start", "end"]


def test_endpointer_force_end():
    ep = Endpointer(VADConfig(min_speech_ms=0), window=160)
    assert ep.force_end() is None
    assert isinstance(ep.push(0.9), SpeechStart)
    ep.push(0.9)
    end = ep.force_end()
    assert isinstance(end, SpeechEnd) and end.start == 0 and ep.onset is None


def test_bad_input_is_a_typed_error():
    stream = SileroVAD.shared().stream()
    with pytest.raises(VADInputError):
        stream.push(np.zeros((2, 100), np.int16))
    with pytest.raises(VADInputError):
        stream.push(np.zeros(100, np.int32))
    with pytest.raises(VADInputError):
        stream.push([0, 1, 2])  # type: ignore[arg-type]


def test_bad_thresholds_are_rejected():
    with pytest.raises(ValueError, match="threshold_low"):
        VADConfig(threshold=0.3, threshold_low=0.5)


def test_model_file_is_found_without_importing_silero_vad():
    code = (
        "import sys; from gateway.asr.vad import find_silero_model; p = find_silero_model(); "
        "assert 'silero_vad' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules); "
        "print(p)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("silero_vad/data/silero_vad_16k_sequence.onnx")
    assert find_silero_model().is_file()
