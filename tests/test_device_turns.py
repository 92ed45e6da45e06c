"""Loopback integration: real uvicorn, real WebSocket device, espeak-ng speech.

Every framing version at both downlink rates: the turn order of the protocol
checklist, the decoded audio against the synthesized speech, and the pacing.
"""

from __future__ import annotations

import statistics
import struct

import numpy as np
import pytest

from audio_codecs.opus import OpusDecoder
from gateway.xiaozhi import AudioOut, LlmEmotion, Stt, TtsSentenceStart, TtsStart, TtsStop
from scripts.device_sim import DeviceSimulator
from tests.gateway_server import running_gateway
from tts_engine.backends.espeak import EspeakBackend
from tts_engine.resample import resample

QUERY = "The weather is fine today. Let us go for a walk in the park!"


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x.astype(np.float64))))) if x.size else 0.0


def reference_speech(sentences: list[str], rate: int) -> np.ndarray:
    """What the backend synthesizes for these sentences, at the session's rate."""
    import torch

    backend = EspeakBackend()
    parts = []
    for text in sentences:
        stream = backend.open_stream(text, backend.default_voice, 1.0)
        chunks = []
        while (chunk := stream.next_chunk()) is not None:
            chunks.append(chunk)
        stream.close()
        wave = torch.from_numpy(np.concatenate(chunks).astype(np.float32))
        parts.append(resample(wave, backend.sample_rate, rate).numpy())
    return (np.concatenate(parts) * 32767).astype(np.int16)


@pytest.mark.parametrize("rate", [16000, 24000])
@pytest.mark.parametrize("version", [1, 2, 3])
async def test_typed_turn_with_espeak(version: int, rate: int):
    async with running_gateway({"audio": {"output_sample_rate": rate}}, backend=EspeakBackend()) as gw:
        sim = DeviceSimulator(gw.url, protocol_version=version)
        ota = await sim.ota()
        assert ota["websocket"]["version"] == 1
        hello = await sim.connect()
        assert hello.audio_params.sample_rate == rate
        await sim.listen_start("auto")
        turn = await sim.ask(QUERY)
        await sim.close()

    events = turn.events
    kinds = [type(e) for e in events if not isinstance(e, AudioOut)]
    assert kinds[:3] == [Stt, TtsStart, LlmEmotion]
    assert kinds[-1] is TtsStop and kinds.count(TtsStop) == 1 and kinds.count(TtsStart) == 1
    assert turn.stt == QUERY
    assert len(turn.sentences) >= 2
    # sentence_start precedes its audio
    first_sentence = events.index(next(e for e in events if isinstance(e, TtsSentenceStart)))
    first_frame = events.index(next(e for e in events if isinstance(e, AudioOut)))
    assert first_sentence < first_frame

    # every downlink frame is one 60 ms Opus packet at the announced rate
    decoder = OpusDecoder(rate)
    for record in turn.frames:
        assert decoder.decode(record.event.opus).size == rate * 60 // 1000
    # binary framing headers exactly as negotiated
    raw = sim.raw_frames[0]
    opus = turn.frames[0].event.opus
    if version == 1:
        assert raw == opus
    elif version == 2:
        assert struct.unpack(">HHIII", raw[:16])[0:2] == (2, 0) and struct.unpack(">I", raw[12:16])[0] == len(
            opus
        )
        assert raw[16:] == opus
    else:
        assert raw[0] == 0 and struct.unpack(">H", raw[2:4])[0] == len(opus) and raw[4:] == opus

    # the decoded audio has the length and energy of the synthesized speech
    ref = reference_speech(turn.sentences, rate)
    frame = rate * 60 // 1000
    assert abs(turn.audio.size - ref.size) <= frame
    assert rms(ref) > 300
    assert 0.7 < rms(turn.audio) / rms(ref) < 1.3

    # timing: >= 100 ms between tts start and audio, real-time pacing, stop after the last frame
    assert turn.time_of(AudioOut) - turn.time_of(TtsStart) >= 0.1
    steady = turn.steady_intervals()
    assert abs(statistics.mean(steady) - 0.060) <= 0.002
    assert turn.max_burst <= 5
    assert turn.time_of(TtsStop) >= turn.frames[-1].t + 0.3
