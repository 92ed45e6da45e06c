"""The MQTT transport's UDP packets (gateway/xiaozhi/udp.py) and one session's checks on them
(gateway/transport/udp_channel.py): sans-I/O, no sockets."""

from __future__ import annotations

import random

import numpy as np
import pytest

from audio_codecs.opus import OpusEncoder
from gateway.transport.udp_channel import REBIND_PACKETS, Accepted, Drop, UdpChannel, plausible_opus
from gateway.xiaozhi import AudioOut, LocalProtocolError, RemoteProtocolError, ServerHello, UdpParams
from gateway.xiaozhi.udp import HEADER_SIZE, UdpCipher, UdpHeader, UdpKeys, check_packet, open_payload, seal

DEVICE, ELSEWHERE = ("10.0.0.5", 40000), ("10.0.0.9", 50000)


def frames(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    pcm = (rng.standard_normal(960 * n) * 3000).astype(np.int16)
    return OpusEncoder(16000, 60).encode(pcm)


def test_the_header_is_big_endian_and_the_ctr_counter_block():
    header = UdpHeader(ssrc=0x11223344, timestamp=0x55667788, sequence=0x99AABBCC, length=0x0102, flags=0x7F)
    assert header.pack() == bytes.fromhex("017f0102112233445566778899aabbcc")
    assert UdpHeader.unpack(header.pack() + b"tail") == header
    # NIST SP 800-38A F.5.1 (CTR-AES128): the 16 header bytes are the initial counter block, and the
    # whole 128-bit block counts up, as mbedtls does on the device
    key = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
    counter = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
    plain = bytes.fromhex("6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51")
    assert UdpCipher(key).apply(counter, plain).hex() == (
        "874d6191b620e3261bef6864990db6ce9806f66b7970fdff8617187bb9fffdff"
    )


def test_seal_and_open_and_the_checks_before_decryption():
    cipher = UdpCipher(bytes(range(16)))
    packet = seal(cipher, UdpHeader(ssrc=7, timestamp=9, sequence=3), b"opus!")
    header = check_packet(packet, max_payload=100)
    assert (header.length, header.ssrc, header.timestamp, header.sequence) == (5, 7, 9, 3)
    assert packet[HEADER_SIZE:] != b"opus!" and open_payload(cipher, packet) == b"opus!"
    for bad in (packet[:15], packet[:-1], packet + b"x", b"\x02" + packet[1:]):
        with pytest.raises(RemoteProtocolError):
            check_packet(bad, max_payload=100)
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        check_packet(packet, max_payload=4)


def test_keys_and_the_hello_object():
    keys = UdpKeys.generate(ssrc=0xDEADBEEF)
    params = keys.params("192.0.2.1", 8884)
    assert params.nonce == "01000000deadbeef0000000000000000" and len(params.key) == 32
    assert UdpKeys.from_params(params) == keys
    hello = ServerHello(session_id="s", transport="udp", udp=params)
    assert hello.udp is params
    with pytest.raises(LocalProtocolError):
        ServerHello(session_id="s", transport="udp")  # a udp hello needs its udp object
    with pytest.raises(LocalProtocolError):
        UdpParams(server="h", port=1, key="00" * 16, nonce="02" + "00" * 15)  # the packet type first
    with pytest.raises(LocalProtocolError):
        UdpParams(server="h", port=1, key="00" * 15, nonce="01" + "00" * 15)  # 15 bytes


def channel(**kw) -> tuple[UdpChannel, UdpCipher]:
    keys = UdpKeys.generate(ssrc=1234)
    return UdpChannel(keys, downlink_ssrc=99, **kw), UdpCipher(keys.key)


def uplink(cipher: UdpCipher, sequence: int, opus: bytes, ssrc: int = 1234, timestamp: int = 0) -> bytes:
    return seal(cipher, UdpHeader(ssrc=ssrc, sequence=sequence, timestamp=timestamp), opus)


def test_sequence_gaps_late_duplicate_and_far_future_packets():
    ch, cipher = channel(sequence_window=100)
    opus = frames(8)
    first = ch.receive(uplink(cipher, 1, opus[0], timestamp=77), DEVICE)
    assert isinstance(first, Accepted) and first.lost == 0 and first.audio.opus == opus[0]
    assert first.audio.timestamp_ms == 77 and ch.address == DEVICE
    gap = ch.receive(uplink(cipher, 4, opus[3]), DEVICE)
    assert isinstance(gap, Accepted) and gap.lost == 2  # 2 and 3 never came
    assert ch.receive(uplink(cipher, 3, opus[2]), DEVICE) is Drop.LATE  # reordered: too late
    assert ch.receive(uplink(cipher, 4, opus[3]), DEVICE) is Drop.LATE  # duplicate
    assert ch.receive(uplink(cipher, 4 + 101, opus[4]), DEVICE) is Drop.OUT_OF_WINDOW
    assert isinstance(ch.receive(uplink(cipher, 5, opus[4]), DEVICE), Accepted)
    assert ch.receive(uplink(cipher, 6, opus[5], ssrc=4321), DEVICE) is Drop.UNKNOWN_SESSION


def test_a_wrong_key_fails_the_opus_check_and_the_address_moves_only_on_three_valid_packets():
    ch, cipher = channel()
    opus = frames(10)
    assert isinstance(ch.receive(uplink(cipher, 1, opus[0]), DEVICE), Accepted)
    wrong = UdpCipher(bytes(16))
    assert ch.receive(uplink(wrong, 2, opus[1]), DEVICE) is Drop.UNDECRYPTABLE
    assert ch.receive(uplink(wrong, 2, opus[1]), ELSEWHERE) is Drop.ADDRESS
    assert ch.receive(uplink(cipher, 1, opus[0]), ELSEWHERE) is Drop.ADDRESS  # a replay from elsewhere
    for seq in range(2, 2 + REBIND_PACKETS - 1):
        assert ch.receive(uplink(cipher, seq, opus[seq]), ELSEWHERE) is Drop.NEW_ADDRESS
        assert ch.address == DEVICE
    moved = ch.receive(uplink(cipher, 2 + REBIND_PACKETS - 1, opus[4]), ELSEWHERE)
    assert isinstance(moved, Accepted) and moved.moved_from == DEVICE and ch.address == ELSEWHERE
    assert moved.lost == REBIND_PACKETS - 1  # the held-back ones are concealed
    # a valid packet from home in between resets a half-proven move
    assert ch.receive(uplink(cipher, 8, opus[8]), DEVICE) is Drop.NEW_ADDRESS
    assert isinstance(ch.receive(uplink(cipher, 9, opus[9]), ELSEWHERE), Accepted)


def test_random_payloads_rarely_pass_the_opus_check():
    rng = random.Random(7)
    passed = sum(plausible_opus(rng.randbytes(rng.randrange(1, 200)), 60) for _ in range(20000))
    assert passed / 20000 < 0.03  # about 1 in 75: the reason a move of address needs 3 in a row
    assert all(plausible_opus(p, 60) for p in frames(20))
    assert not any(plausible_opus(p, 20) for p in frames(5))


def test_downlink_packets_count_up_with_our_own_ssrc():
    ch, cipher = channel()
    packets = [ch.seal(AudioOut(opus=o, timestamp_ms=60 * i)) for i, o in enumerate(frames(3))]
    headers = [UdpHeader.unpack(p) for p in packets]
    assert [h.sequence for h in headers] == [1, 2, 3]
    assert {h.ssrc for h in headers} == {99} and [h.timestamp for h in headers] == [0, 60, 120]
    assert open_payload(cipher, packets[1]) == frames(3)[1]
