import io
import struct
import wave

import numpy as np
import pytest

from audio_codecs import WavFormatError, float_to_int16, read_wav, streaming_wav_header, wav_bytes

KSDATAFORMAT_SUBTYPE_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"


def riff(fmt: bytes, data: bytes, extra_chunks: bytes = b"") -> bytes:
    """A WAV file built chunk by chunk, for layouts the stdlib cannot write."""
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra_chunks
    body += b"data" + struct.pack("<I", len(data)) + data + (b"\x00" if len(data) % 2 else b"")
    return b"RIFF" + struct.pack("<I", len(body)) + body


def fmt_chunk(tag: int, channels: int, rate: int, bits: int) -> bytes:
    align = channels * bits // 8
    return struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits)


def extensible_fmt(sub_tag: int, channels: int, rate: int, bits: int) -> bytes:
    base = fmt_chunk(0xFFFE, channels, rate, bits)
    return base + struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", sub_tag) + KSDATAFORMAT_SUBTYPE_TAIL


def stdlib_wav(frames: bytes, sample_width: int, channels: int = 1, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(sample_width)
        writer.setframerate(rate)
        writer.writeframes(frames)
    return buffer.getvalue()


def test_wav_bytes_is_a_complete_riff_file() -> None:
    pcm = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
    data = wav_bytes(pcm, 24000)
    riff_size, data_size = struct.unpack_from("<I", data, 4)[0], struct.unpack_from("<I", data, 40)[0]
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE" and data[36:40] == b"data"
    assert riff_size == len(data) - 8 and data_size == 2 * pcm.shape[0] == len(data) - 44
    with wave.open(io.BytesIO(data)) as reader:
        assert (reader.getnchannels(), reader.getsampwidth(), reader.getframerate()) == (1, 2, 24000)
        assert np.array_equal(np.frombuffer(reader.readframes(100), dtype="<i2"), pcm)


def test_wav_bytes_round_trips_through_read_wav_exactly(tmp_path) -> None:
    pcm = np.random.default_rng(0).integers(-32768, 32768, 5000).astype(np.int16)
    samples, rate = read_wav(wav_bytes(pcm, 16000))
    assert rate == 16000 and samples.dtype == np.float32
    assert np.array_equal(samples, pcm.astype(np.float32) / 32768)
    assert np.array_equal(float_to_int16(samples), pcm)
    path = tmp_path / "a.wav"
    path.write_bytes(wav_bytes(pcm, 16000))
    from_path, _ = read_wav(path)
    assert np.array_equal(from_path, samples)
    assert np.array_equal(read_wav(str(path))[0], samples)


def test_wav_bytes_rejects_float_and_bad_rates() -> None:
    with pytest.raises(TypeError, match="int16"):
        wav_bytes(np.zeros(10, dtype=np.float32), 16000)
    with pytest.raises(ValueError, match="sample_rate"):
        wav_bytes(np.zeros(10, dtype=np.int16), 0)
    with pytest.raises(ValueError, match="shape"):
        wav_bytes(np.zeros((2, 2, 2), dtype=np.int16), 16000)


def test_streaming_header_has_unknown_sizes_and_reads_back() -> None:
    header = streaming_wav_header(24000)
    assert len(header) == 44
    assert struct.unpack_from("<I", header, 4)[0] == 0xFFFFFFFF
    assert struct.unpack_from("<I", header, 40)[0] == 0xFFFFFFFF
    assert struct.unpack_from("<HHIIHH", header, 20) == (1, 1, 24000, 48000, 2, 16)
    pcm = np.arange(-500, 500, 7, dtype=np.int16)
    samples, rate = read_wav(header + pcm.tobytes() + b"\x01")  # a cut-off last sample is dropped
    assert rate == 24000
    assert np.array_equal(samples, pcm / np.float32(32768))


def test_streaming_header_validates_layout() -> None:
    assert struct.unpack_from("<HHIIHH", streaming_wav_header(48000, 2, 24), 20) == (
        1,
        2,
        48000,
        288000,
        6,
        24,
    )
    with pytest.raises(ValueError):
        streaming_wav_header(16000, bits=12)
    with pytest.raises(ValueError):
        streaming_wav_header(16000, channels=0)


def test_reads_8_24_and_32_bit_pcm() -> None:
    values = np.array([-1.0, -0.5, 0.0, 0.25, 0.5], dtype=np.float64)
    eight = (values * 128 + 128).astype(np.uint8).tobytes()
    assert np.allclose(read_wav(stdlib_wav(eight, 1))[0], values)
    ints24 = (values * 8388608).astype(np.int64)
    frames24 = b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints24)
    assert np.array_equal(read_wav(stdlib_wav(frames24, 3))[0], values.astype(np.float32))
    ints32 = (values * 2147483648).astype(np.int64).astype("<i4")
    assert np.array_equal(read_wav(stdlib_wav(ints32.tobytes(), 4))[0], values.astype(np.float32))


def test_reads_float32_and_float64() -> None:
    values = np.array([0.0, 0.1, -0.7, 1.0], dtype=np.float32)
    samples, rate = read_wav(riff(fmt_chunk(3, 1, 22050, 32), values.astype("<f4").tobytes()))
    assert rate == 22050 and np.array_equal(samples, values)
    samples64, _ = read_wav(riff(fmt_chunk(3, 1, 22050, 64), values.astype("<f8").tobytes()))
    assert np.array_equal(samples64, values)


def test_reads_wave_format_extensible_pcm_and_float() -> None:
    pcm = np.array([100, -200, 300, -400], dtype="<i2")
    samples, rate = read_wav(riff(extensible_fmt(1, 1, 48000, 16), pcm.tobytes()))
    assert rate == 48000 and np.array_equal(samples, pcm / np.float32(32768))
    floats = np.array([0.5, -0.25], dtype="<f4")
    assert np.array_equal(read_wav(riff(extensible_fmt(3, 1, 48000, 32), floats.tobytes()))[0], floats)


def test_stereo_is_mixed_to_mono() -> None:
    left = np.array([1000, 2000, -3000], dtype=np.int16)
    right = np.array([3000, 0, -1000], dtype=np.int16)
    interleaved = np.stack([left, right], axis=1)
    samples, _ = read_wav(wav_bytes(interleaved, 16000))
    assert np.allclose(samples, (left.astype(np.float32) + right) / 2 / 32768)


def test_skips_other_chunks_including_odd_sized_ones() -> None:
    pcm = np.array([1, 2, 3], dtype="<i2")
    extra = b"LIST" + struct.pack("<I", 3) + b"abc\x00" + b"junk" + struct.pack("<I", 4) + b"1234"
    samples, _ = read_wav(riff(fmt_chunk(1, 1, 8000, 16), pcm.tobytes(), extra))
    assert np.array_equal(samples, pcm / np.float32(32768))


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"hello world, not a wav",
        b"RIFF\x04\x00\x00\x00WAVE",  # no chunks at all
        riff(fmt_chunk(1, 1, 16000, 16), b"")[:20],  # cut inside the fmt chunk
        riff(fmt_chunk(2, 1, 16000, 4), b"\x00" * 8),  # ADPCM
        riff(fmt_chunk(3, 1, 16000, 16), b"\x00" * 8),  # 16-bit "float"
        riff(fmt_chunk(1, 0, 16000, 16), b"\x00" * 8),  # zero channels
        riff(fmt_chunk(1, 1, 16000, 12), b"\x00" * 8),  # 12-bit
        riff(extensible_fmt(1, 1, 16000, 16)[:24], b"\x00" * 8),  # truncated extensible fmt
        b"RIFF\x10\x00\x00\x00WAVEdata\x04\x00\x00\x00\x00\x00\x00\x00",  # data before fmt
    ],
)
def test_garbage_raises_wav_format_error(garbage: bytes) -> None:
    with pytest.raises(WavFormatError):
        read_wav(garbage)
    assert issubclass(WavFormatError, ValueError)


def test_float_to_int16_clips_rounds_and_zeroes_nan() -> None:
    x = np.array([0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 1 / 65536, -1 / 65536 - 1e-9, np.nan, np.inf])
    out = float_to_int16(x)
    assert out.dtype == np.int16
    assert out.tolist() == [0, 32767, -32768, 32767, -32768, 16384, 0, -1, 0, 32767]


# ---- malformed headers: every one is a WavFormatError, never ZeroDivisionError, struct.error, ... ----


def raw_fmt(
    tag: int = 1, channels: int = 1, rate: int = 16000, bits: int = 16, align: int | None = None
) -> bytes:
    """A fmt chunk with every field as given (no consistency): the way a broken writer makes them."""
    align = channels * bits // 8 if align is None else align
    return struct.pack("<HHIIHH", tag, channels, rate, (rate * align) & 0xFFFFFFFF, align & 0xFFFF, bits)


def declared(data: bytes, size: int) -> bytes:
    """A valid 16-bit WAV whose data chunk declares ``size`` bytes but holds ``data``."""
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + raw_fmt() + b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


MALFORMED = {
    "bits 0, block_align 0": riff(raw_fmt(bits=0, align=0), b"\x00" * 64),
    "bits 0, stereo": riff(raw_fmt(channels=2, bits=0, align=0), b"\x00" * 64),
    "extensible, bits 0": riff(
        raw_fmt(tag=0xFFFE, bits=0, align=0)
        + struct.pack("<HHI", 22, 0, 0)
        + b"\x01\x00"
        + KSDATAFORMAT_SUBTYPE_TAIL,
        b"\x00" * 64,
    ),
    "bits 4": riff(raw_fmt(bits=4, align=0), b"\x00" * 64),
    "block_align 0 with 16 bits": riff(raw_fmt(align=0), b"\x00" * 64),
    "block_align disagrees": riff(raw_fmt(align=3), b"\x00" * 64),
    "channels 0": riff(raw_fmt(channels=0), b"\x00" * 64),
    "sample rate 0": riff(raw_fmt(rate=0), b"\x00" * 64),
    "sample rate 2^32-1": riff(raw_fmt(rate=0xFFFFFFFF), b"\x00" * 64),
    "sample rate 10 MHz": riff(raw_fmt(rate=10_000_000), b"\x00" * 64),
    "format tag 0": riff(raw_fmt(tag=0), b"\x00" * 64),
    "format tag 0x55 (mp3)": riff(raw_fmt(tag=0x55), b"\x00" * 64),
    "format tag 0xFFFF": riff(raw_fmt(tag=0xFFFF), b"\x00" * 64),
    "bits 65528": riff(raw_fmt(bits=65528, align=8191), b"\x00" * 64),
    "empty": b"",
    "RIFF only": b"RIFF",
    "not WAV": b"ID3\x04\x00" + bytes(100),
    "RIFX (big-endian)": b"RIFX" + riff(raw_fmt(), b"\x00" * 64)[4:],
    "fmt chunk 2^32-1 bytes": b"RIFF\xff\xff\xff\xffWAVEfmt \xff\xff\xff\xff" + raw_fmt(),
    "cut in the header": riff(raw_fmt(), b"\x00" * 64)[:30],
    "no data chunk": b"RIFF\x1c\x00\x00\x00WAVEfmt \x10\x00\x00\x00" + raw_fmt(),
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_headers_raise_wav_format_error(data: bytes) -> None:
    with pytest.raises(WavFormatError):
        read_wav(data)


def test_declared_sizes_past_the_end_read_the_bytes_present() -> None:
    pcm = np.arange(-50, 50, dtype="<i2")
    for size in (len(pcm.tobytes()) + 2, 0x7FFFFFFF, 0xFFFFFFFF):  # truncated file, huge size, streamed WAV
        samples, rate = read_wav(declared(pcm.tobytes(), size))
        assert rate == 16000 and np.array_equal(samples, pcm / np.float32(32768))
    samples, _ = read_wav(declared(pcm.tobytes() + b"\x01", 0xFFFFFFFF))  # a partial last sample is dropped
    assert samples.size == pcm.size


def test_random_corruptions_decode_or_raise_wav_format_error() -> None:
    """Property: whatever bytes of a header are changed, the result is audio or our typed error."""
    rng = np.random.default_rng(12)
    layouts = [
        riff(fmt_chunk(1, 1, 16000, 16), np.arange(64, dtype="<i2").tobytes()),
        riff(fmt_chunk(3, 2, 48000, 32), np.zeros(32, dtype="<f4").tobytes()),
        riff(extensible_fmt(1, 2, 44100, 24), bytes(96)),
    ]
    for _ in range(3000):
        data = bytearray(layouts[rng.integers(len(layouts))])
        header = min(len(data), 72)
        for pos in rng.integers(0, header, size=rng.integers(1, 5)):
            data[pos] = rng.choice([0, 0xFF, int(rng.integers(256))])
        if rng.random() < 0.2:
            data = data[: rng.integers(len(data) + 1)]
        try:
            samples, rate = read_wav(bytes(data))
        except WavFormatError:
            continue
        assert samples.dtype == np.float32 and samples.ndim == 1 and 1 <= rate <= 768_000


def test_decode_audio_refuses_garbage_with_codec_errors_and_stops_long_files() -> None:
    from audio_codecs.errors import AudioCodecError
    from audio_codecs.formats import decode_audio, encode_audio

    for data in [*MALFORMED.values(), b"\x00\x01\x02" * 100, b"fLaC" + bytes(50)]:
        with pytest.raises(AudioCodecError):
            decode_audio(data)
    flac = encode_audio(np.zeros(16000 * 60, dtype=np.int16), 16000, "flac")  # a minute of silence: ~10 kB
    samples, rate = decode_audio(flac, max_seconds=5)
    assert rate == 16000 and 5 * rate < samples.size < 10 * rate  # stopped soon after the limit
    assert decode_audio(flac)[0].size == 60 * 16000
