import numpy as np
import opuslib_next
import pytest

from audio_codecs import OpusDecodeError, OpusDecoder, OpusEncoder, packet_duration_ms


def tone(freq: float, sample_rate: int, seconds: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    return np.round(amplitude * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def speechy(sample_rate: int, seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 2000, int(sample_rate * seconds))
    return np.clip(tone(220, sample_rate, seconds) + noise, -32768, 32767).astype(np.int16)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))


def raw_libopus_packet(sample_rate: int, frame_samples: int, application: str = "voip") -> bytes:
    """A packet of any libopus-supported duration, made without our wrapper."""
    encoder = opuslib_next.Encoder(sample_rate, 1, application)
    return encoder.encode(tone(440, sample_rate, 1.0)[:frame_samples].tobytes(), frame_samples)


@pytest.mark.parametrize("sample_rate", [16000, 24000])
def test_round_trip_of_a_tone_keeps_length_energy_and_pitch(sample_rate: int) -> None:
    pcm = tone(440, sample_rate, 1.2)
    encoder = OpusEncoder(sample_rate)
    assert encoder.frame_samples == sample_rate * 60 // 1000
    packets = encoder.encode(pcm) + encoder.flush()
    assert len(packets) == -(-pcm.shape[0] // encoder.frame_samples)
    assert all(len(packet) < 400 for packet in packets)  # about 24 kbit/s, not raw PCM
    decoder = OpusDecoder(sample_rate)
    frames = [decoder.decode(packet) for packet in packets]
    assert all(frame.dtype == np.int16 and frame.shape == (encoder.frame_samples,) for frame in frames)
    decoded = np.concatenate(frames)[: pcm.shape[0]]
    steady = slice(sample_rate // 5, pcm.shape[0] - sample_rate // 5)  # skip codec start-up
    assert abs(rms(decoded[steady]) / rms(pcm[steady]) - 1) < 0.15
    spectrum = np.abs(np.fft.rfft(decoded[steady]))
    peak_hz = spectrum.argmax() * sample_rate / decoded[steady].shape[0]
    assert abs(peak_hz - 440) < 5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_split_gives_the_same_packets_as_one_call(seed: int) -> None:
    pcm = speechy(16000, 0.7, seed)
    whole = OpusEncoder(16000, 20)
    expected = whole.encode(pcm) + whole.flush()
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, pcm.shape[0], size=25))
    split = OpusEncoder(16000, 20)
    got: list[bytes] = []
    for chunk in np.split(pcm, cuts):
        got += split.encode(chunk)
    got += split.flush()
    assert got == expected


def test_bytes_input_equals_array_input() -> None:
    pcm = speechy(24000, 0.3)
    from_array, from_bytes = OpusEncoder(24000), OpusEncoder(24000)
    assert from_bytes.encode(pcm.astype("<i2").tobytes()) == from_array.encode(pcm)
    assert from_bytes.pending_samples == from_array.pending_samples == pcm.shape[0] % 1440


def test_partial_frame_waits_and_flush_pads_it_with_silence() -> None:
    pcm = speechy(16000, 0.09)  # 1440 samples: one 60 ms frame and a half
    encoder = OpusEncoder(16000)
    packets = encoder.encode(pcm)
    assert len(packets) == 1 and encoder.pending_samples == 480
    tail = encoder.flush()
    assert len(tail) == 1 and encoder.pending_samples == 0
    assert encoder.flush() == []
    padded = OpusEncoder(16000)
    assert padded.encode(np.concatenate([pcm, np.zeros(480, dtype=np.int16)])) == packets + tail
    assert OpusDecoder(16000).decode(tail[0]).shape == (960,)


def test_flush_adds_nothing_after_whole_frames_and_encoder_stays_usable() -> None:
    encoder = OpusEncoder(24000)
    assert len(encoder.encode(speechy(24000, 0.12))) == 2
    assert encoder.flush() == []
    more = encoder.encode(speechy(24000, 0.06, seed=3))
    assert len(more) == 1 and OpusDecoder(24000).decode(more[0]).shape == (1440,)


def test_clear_drops_pending_samples_and_resets_the_codec() -> None:
    first, second = speechy(16000, 0.25, seed=1), speechy(16000, 0.24, seed=2)
    encoder = OpusEncoder(16000)
    encoder.encode(first)
    assert encoder.pending_samples > 0
    encoder.clear()
    assert encoder.pending_samples == 0
    assert encoder.encode(second) == OpusEncoder(16000).encode(second)


@pytest.mark.parametrize("frame_ms", [10, 20, 40, 60])
def test_every_frame_size_round_trips(frame_ms: int) -> None:
    encoder = OpusEncoder(16000, frame_ms)
    packets = encoder.encode(speechy(16000, 0.24))
    assert len(packets) == 240 // frame_ms
    decoder = OpusDecoder(16000)
    assert all(packet_duration_ms(packet) == frame_ms for packet in packets)
    assert all(decoder.decode(packet).shape == (16 * frame_ms,) for packet in packets)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample_rate": 22050}, "sample_rate"),
        ({"sample_rate": 16000, "frame_ms": 30}, "frame_ms"),
        ({"sample_rate": 16000, "bitrate": 100}, "bitrate"),
        ({"sample_rate": 16000, "complexity": 11}, "complexity"),
    ],
)
def test_invalid_encoder_settings_raise_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OpusEncoder(**kwargs)


def test_invalid_pcm_is_rejected_with_a_typed_error() -> None:
    encoder = OpusEncoder(16000)
    with pytest.raises(TypeError, match="int16"):
        encoder.encode(np.zeros(960, dtype=np.float32))
    with pytest.raises(ValueError, match="1-D"):
        encoder.encode(np.zeros((2, 960), dtype=np.int16))
    with pytest.raises(ValueError, match="even"):
        encoder.encode(b"\x00\x01\x02")
    with pytest.raises(TypeError):
        encoder.encode([0, 1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize("frame_ms", [20, 40, 60, 120])
def test_decoder_takes_packets_of_any_duration_at_16k(frame_ms: int) -> None:
    packet = raw_libopus_packet(16000, 16 * frame_ms)
    assert packet_duration_ms(packet, 16000) == frame_ms
    assert OpusDecoder(16000).decode(packet).shape == (16 * frame_ms,)


def test_decoder_takes_2_5_ms_celt_packets_and_other_rates() -> None:
    short = raw_libopus_packet(48000, 120, application="restricted_lowdelay")
    assert packet_duration_ms(short) == 2.5
    assert OpusDecoder(16000).decode(short).shape == (40,)
    packet_24k = OpusEncoder(24000).encode(tone(440, 24000, 0.06))[0]
    assert OpusDecoder(16000).decode(packet_24k).shape == (960,)  # Opus decodes at any rate


def test_dtx_packets_of_one_to_three_bytes_decode_without_error() -> None:
    encoder = opuslib_next.Encoder(16000, 1, "voip")
    encoder.dtx = 1
    silence = np.zeros(960, dtype=np.int16).tobytes()
    dtx_packets = [encoder.encode(silence, 960) for _ in range(30)]
    short = [packet for packet in dtx_packets if len(packet) <= 3]
    assert short, "libopus DTX should produce 1-3 byte packets for silence"
    decoder = OpusDecoder(16000)
    for packet in short:
        out = decoder.decode(packet)
        assert out.dtype == np.int16 and out.shape[0] in (0, 960)
        assert np.abs(out.astype(np.int32)).max(initial=0) < 1000
    for config in range(32):  # a TOC byte alone is a legal empty (DTX) frame for every config
        out = decoder.decode(bytes([config << 3]))
        assert out.shape[0] in (0, round(packet_duration_ms(bytes([config << 3])) * 16))


def test_empty_packet_gives_empty_pcm() -> None:
    out = OpusDecoder(16000).decode(b"")
    assert out.dtype == np.int16 and out.shape == (0,)


@pytest.mark.parametrize(
    "junk",
    [
        bytes([0x43, 0x00]),  # code 3 with zero frames
        bytes([0x41, 1, 2, 3]),  # code 1 (two equal frames) with an odd payload
        bytes([0x42, 250, 1]),  # code 2 whose first frame is longer than the packet
        bytes([0x43, 0x31]) + bytes(10),  # code 3 with 49 frames (> 120 ms)
    ],
)
def test_corrupt_packets_raise_opus_decode_error(junk: bytes) -> None:
    decoder = OpusDecoder(16000)
    with pytest.raises(OpusDecodeError):
        decoder.decode(junk)
    good = OpusEncoder(16000).encode(tone(440, 16000, 0.06))[0]
    assert decoder.decode(good).shape == (960,)  # the decoder survives the bad packet


def test_random_bytes_decode_or_raise_opus_decode_error_only() -> None:
    rng = np.random.default_rng(0)
    decoder = OpusDecoder(16000)
    rejected = 0
    for _ in range(300):
        packet = rng.bytes(int(rng.integers(1, 80)))
        try:
            out = decoder.decode(packet)
        except OpusDecodeError:
            rejected += 1
        else:
            assert out.dtype == np.int16 and out.shape[0] <= 1920
    assert rejected > 0


def test_decoder_rejects_non_bytes_and_bad_rates() -> None:
    with pytest.raises(TypeError):
        OpusDecoder(16000).decode("abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sample_rate"):
        OpusDecoder(44100)


def test_packet_duration_of_bad_packets_raises() -> None:
    with pytest.raises(OpusDecodeError):
        packet_duration_ms(b"")
    with pytest.raises(OpusDecodeError):
        packet_duration_ms(bytes([0x43]))  # code 3 without its frame count byte
