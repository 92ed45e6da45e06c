"""audio_codecs.formats: whole files and streamed encodings of wav, pcm, mp3, opus, flac, aac."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from audio_codecs.errors import AudioCodecError
from audio_codecs.formats import (
    AUDIO_FORMATS,
    CONTENT_TYPES,
    StreamingEncoder,
    UnsupportedFormat,
    check_format,
    decode_audio,
    encode_audio,
)
from audio_codecs.wav import read_wav

RATE = 24000


def tone(seconds: float, rate: int = RATE, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return np.round(8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[int(np.argmax(spectrum))])


def test_every_format_has_a_content_type():
    assert set(CONTENT_TYPES) == set(AUDIO_FORMATS)


@pytest.mark.parametrize(
    ("fmt", "rate"),
    [("ogg", RATE), ("opus", 22050), ("opus", 44100), ("mp3", 96000), ("wav", 0), ("wav", True)],
)
def test_check_format_refuses_what_cannot_be_written(fmt, rate):
    with pytest.raises(UnsupportedFormat) as err:
        check_format(fmt, rate)
    assert isinstance(err.value, ValueError) and str(err.value)


def test_wav_and_pcm_whole_files_are_exact():
    pcm = tone(0.5)
    samples, rate = read_wav(encode_audio(pcm, RATE, "wav"))
    assert rate == RATE and np.array_equal(np.round(samples * 32768).astype(np.int16), pcm)
    assert encode_audio(pcm, RATE, "pcm") == pcm.astype("<i2").tobytes()


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "aac"])
@pytest.mark.parametrize("rate", [16000, 24000, 48000])
def test_compressed_whole_files_decode_to_the_same_tone(fmt, rate):
    data = encode_audio(tone(1.0, rate), rate, fmt)
    samples, decoded_rate = decode_audio(data)
    assert abs(samples.size / decoded_rate - 1.0) < 0.15  # codec priming and padding: up to 2 frames
    assert abs(peak_hz(samples, decoded_rate) - 440.0) < 3


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "aac", "wav", "pcm"])
def test_streaming_encoder_emits_bytes_before_the_end(fmt):
    encoder = StreamingEncoder(fmt, RATE)
    pieces = [encoder.encode(chunk) for chunk in np.array_split(tone(2.0), 20)]  # 100 ms chunks
    tail = encoder.finish()
    assert sum(1 for p in pieces[:10] if p) >= 5  # the first second is out before the last chunk
    data = b"".join(pieces) + tail
    if fmt == "pcm":
        assert data == tone(2.0).astype("<i2").tobytes()
        return
    if fmt == "wav":
        assert struct.unpack_from("<I", data, 40)[0] == 0xFFFFFFFF  # streaming header: length unknown
    samples, rate = decode_audio(data)
    assert abs(samples.size / rate - 2.0) < 0.15 and abs(peak_hz(samples, rate) - 440.0) < 3


def test_streaming_encoder_state_errors():
    encoder = StreamingEncoder("mp3", RATE)
    encoder.encode(tone(0.2))
    assert encoder.finish() and encoder.finish() == b""
    with pytest.raises(AudioCodecError):
        encoder.encode(tone(0.1))


def test_bad_pcm_and_bad_files():
    with pytest.raises(TypeError):
        encode_audio(np.zeros(10, dtype=np.float32), RATE, "wav")
    with pytest.raises(ValueError):
        encode_audio(np.zeros((10, 2), dtype=np.int16), RATE, "mp3")
    with pytest.raises(AudioCodecError):
        decode_audio(b"definitely not audio" * 10)
