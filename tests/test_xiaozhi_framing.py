"""Binary audio framing v1/v2/v3 (docs/xiaozhi-protocol.md section 5)."""

import random

import pytest

from gateway.xiaozhi.errors import LocalProtocolError, RemoteProtocolError
from gateway.xiaozhi.framing import header_size, pack_audio, unpack_audio

OPUS = bytes([0x58, 0x07, 0xA1, 0xFF, 0x00])


# --- known frames as byte literals ---------------------------------------------------------


def test_v1_is_the_raw_packet():
    assert pack_audio(1, OPUS) == OPUS
    assert unpack_audio(1, OPUS) == (OPUS, 0)


def test_v2_header_layout():
    frame = pack_audio(2, OPUS, timestamp_ms=0x01020304)
    assert (
        frame
        == (
            b"\x00\x02"  # version = 2
            b"\x00\x00"  # type = 0 (Opus)
            b"\x00\x00\x00\x00"  # reserved
            b"\x01\x02\x03\x04"  # timestamp, big-endian
            b"\x00\x00\x00\x05"  # payload_size = 5
        )
        + OPUS
    )


def test_v2_header_with_zero_timestamp_and_empty_payload():
    assert pack_audio(2, b"") == b"\x00\x02" + b"\x00" * 14


def test_v3_header_layout():
    assert pack_audio(3, OPUS) == b"\x00\x00\x00\x05" + OPUS
    assert pack_audio(3, bytes(300)) == b"\x00\x00\x01\x2c" + bytes(300)


def test_unpack_firmware_v2_frame():
    frame = b"\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x27\x10\x00\x00\x00\x03abc"
    assert unpack_audio(2, frame) == (b"abc", 10000)


def test_unpack_firmware_v3_frame():
    assert unpack_audio(3, b"\x00\x00\x00\x03abc") == (b"abc", 0)


def test_header_sizes():
    assert [header_size(v) for v in (1, 2, 3)] == [0, 16, 4]


# --- receive rules -------------------------------------------------------------------------


def test_v2_ignores_version_type_and_reserved_fields_like_the_firmware():
    frame = b"\x00\x07\x00\x01\xde\xad\xbe\xef\x00\x00\x00\x09\x00\x00\x00\x02hi"
    assert unpack_audio(2, frame) == (b"hi", 9)


def test_v3_ignores_type_and_reserved_fields():
    assert unpack_audio(3, b"\x05\x06\x00\x02hi") == (b"hi", 0)


@pytest.mark.parametrize("version", [2, 3])
def test_trailing_bytes_after_payload_are_ignored(version):
    frame = pack_audio(version, OPUS, timestamp_ms=7) + b"\xff\xff\xff"
    opus, _ = unpack_audio(version, frame)
    assert opus == OPUS


@pytest.mark.parametrize("version", [2, 3])
def test_zero_payload_size_gives_empty_packet(version):
    assert unpack_audio(version, pack_audio(version, b""))[0] == b""


@pytest.mark.parametrize("version", [2, 3])
def test_frame_shorter_than_header_is_rejected(version):
    frame = pack_audio(version, OPUS)
    for cut in range(header_size(version)):
        with pytest.raises(RemoteProtocolError):
            unpack_audio(version, frame[:cut])


@pytest.mark.parametrize("version", [2, 3])
def test_frame_shorter_than_payload_size_is_rejected(version):
    frame = pack_audio(version, OPUS)
    for cut in range(header_size(version), len(frame)):
        with pytest.raises(RemoteProtocolError):
            unpack_audio(version, frame[:cut])


def test_v1_accepts_empty_frame():
    assert unpack_audio(1, b"") == (b"", 0)


def test_accepts_bytearray_and_memoryview():
    frame = pack_audio(3, OPUS)
    assert unpack_audio(3, bytearray(frame)) == (OPUS, 0)
    assert unpack_audio(3, memoryview(frame)) == (OPUS, 0)
    assert pack_audio(3, bytearray(OPUS)) == frame


# --- send rules ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 3])
def test_versions_without_timestamp_drop_it(version):
    assert unpack_audio(version, pack_audio(version, OPUS, timestamp_ms=1234)) == (OPUS, 0)


def test_v3_payload_size_limit():
    largest = bytes(65535)
    assert unpack_audio(3, pack_audio(3, largest)) == (largest, 0)
    with pytest.raises(LocalProtocolError):
        pack_audio(3, bytes(65536))


@pytest.mark.parametrize("timestamp", [-1, 2**32, 1.5, True, "0"])
def test_bad_timestamp_is_a_local_error(timestamp):
    with pytest.raises(LocalProtocolError):
        pack_audio(2, OPUS, timestamp_ms=timestamp)


def test_largest_v2_timestamp_round_trips():
    assert unpack_audio(2, pack_audio(2, OPUS, timestamp_ms=2**32 - 1)) == (OPUS, 2**32 - 1)


@pytest.mark.parametrize("version", [0, 4, -1, True, 2.0, "2", None])
def test_unknown_version_is_a_local_error(version):
    with pytest.raises(LocalProtocolError):
        pack_audio(version, OPUS)
    with pytest.raises(LocalProtocolError):
        unpack_audio(version, OPUS)
    with pytest.raises(LocalProtocolError):
        header_size(version)


@pytest.mark.parametrize("payload", ["text", 5, None, [1, 2]])
def test_non_bytes_is_a_local_error(payload):
    with pytest.raises(LocalProtocolError):
        pack_audio(2, payload)
    with pytest.raises(LocalProtocolError):
        unpack_audio(2, payload)


# --- properties ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3])
def test_random_packets_round_trip(version):
    rng = random.Random(version)
    for _ in range(500):
        opus = rng.randbytes(rng.randrange(0, 400))
        timestamp = rng.randrange(0, 2**32)
        frame = pack_audio(version, opus, timestamp_ms=timestamp)
        assert len(frame) == header_size(version) + len(opus)
        assert unpack_audio(version, frame) == (opus, timestamp if version == 2 else 0)


def _mangled_frame(rng: random.Random, version: int) -> bytes:
    """Random bytes, or a valid frame with bytes flipped, cut off or appended."""
    if rng.random() < 0.3:
        return rng.randbytes(rng.randrange(0, 40))
    frame = bytearray(pack_audio(version, rng.randbytes(rng.randrange(0, 30)), rng.randrange(2**32)))
    for _ in range(rng.randrange(3)):
        if frame:
            frame[rng.randrange(len(frame))] = rng.randrange(256)
    choice = rng.random()
    if choice < 0.4:
        del frame[rng.randrange(len(frame) + 1) :]
    elif choice < 0.6:
        frame += rng.randbytes(rng.randrange(1, 10))
    return bytes(frame)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_mangled_frames_unpack_or_raise_remote_error(version):
    rng = random.Random(100 + version)
    outcomes = set()
    for _ in range(3000):
        data = _mangled_frame(rng, version)
        try:
            opus, timestamp = unpack_audio(version, data)
        except RemoteProtocolError:
            outcomes.add("error")
            continue
        outcomes.add("ok")
        assert isinstance(opus, bytes) and isinstance(timestamp, int)
        assert data[header_size(version) :].startswith(opus)
    assert outcomes == ({"ok"} if version == 1 else {"ok", "error"})
