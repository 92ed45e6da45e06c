"""The MQTT transport's UDP audio packets (docs/mqtt-udp.md), sans-I/O.

Every datagram, in both directions, is a 16-byte big-endian header followed by one Opus packet
encrypted with AES-128-CTR::

    u8 type = 0x01 | u8 flags | u16 payload length | u32 ssrc | u32 timestamp | u32 sequence

The header is also the CTR counter block (the whole 128 bits count up, as in mbedtls and OpenSSL).
The device builds its uplink headers from the ``nonce`` of the server hello, overwriting only the
length, timestamp and sequence (its first sequence is 1): so the nonce's first byte must be 0x01 and
its ssrc names the session. It drops downlink packets shorter than 16 bytes, of another type, with a
wrong length or with a sequence below the last one.

The cipher is the `cryptography` package's AES-CTR. There is no authentication tag in this format
(it is the firmware's): a packet "decrypts" to something for any key, which is why the receiver
(gateway/transport/udp_channel.py) also checks that the plaintext is a plausible Opus packet.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .errors import CloseCode, LocalProtocolError, RemoteProtocolError
from .events import UdpParams

PACKET_TYPE_AUDIO = 0x01
HEADER = struct.Struct(">BBHIII")  # type, flags, payload length, ssrc, timestamp, sequence
HEADER_SIZE = HEADER.size  # 16
KEY_SIZE = 16
_U32 = 2**32 - 1


@dataclass(frozen=True, slots=True)
class UdpHeader:
    """One packet's header; ``pack()`` gives the 16 bytes that are also its counter block."""

    ssrc: int
    timestamp: int = 0
    sequence: int = 0
    length: int = 0
    flags: int = 0
    type: int = PACKET_TYPE_AUDIO

    def __post_init__(self) -> None:
        for name, limit in (("type", 255), ("flags", 255), ("length", 65535), ("ssrc", _U32),
                            ("timestamp", _U32), ("sequence", _U32)):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
                raise LocalProtocolError(f"UDP header {name}={value!r} is out of range 0..{limit}")

    def pack(self) -> bytes:
        return HEADER.pack(self.type, self.flags, self.length, self.ssrc, self.timestamp, self.sequence)

    @classmethod
    def unpack(cls, data: bytes) -> UdpHeader:
        """The header of a received datagram; RemoteProtocolError when it is shorter than 16 bytes."""
        if len(data) < HEADER_SIZE:
            raise RemoteProtocolError(
                f"UDP packet of {len(data)} bytes is shorter than its header", close_code_hint=CloseCode.INVALID_DATA
            )
        kind, flags, length, ssrc, timestamp, sequence = HEADER.unpack_from(data)
        return cls(ssrc=ssrc, timestamp=timestamp, sequence=sequence, length=length, flags=flags, type=kind)


def ssrc_of(data: bytes) -> int | None:
    """The session a datagram claims (its ssrc field), read without parsing the rest; None if too short."""
    return int.from_bytes(data[4:8], "big") if len(data) >= HEADER_SIZE else None


class UdpCipher:
    """AES-128-CTR with the packet header as the counter block (encryption and decryption are one)."""

    __slots__ = ("_algorithm",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) != KEY_SIZE:
            raise LocalProtocolError("the UDP key must be 16 bytes")
        self._algorithm = algorithms.AES(key)

    def apply(self, counter_block: bytes, data: bytes) -> bytes:
        if not data:
            return b""
        cipher = Cipher(self._algorithm, modes.CTR(counter_block)).encryptor()
        return cipher.update(data) + cipher.finalize()


def seal(cipher: UdpCipher, header: UdpHeader, opus: bytes) -> bytes:
    """One datagram: ``header`` (its length set to the payload's) and the encrypted Opus packet."""
    if len(opus) > 65535:
        raise LocalProtocolError(f"an Opus packet of {len(opus)} bytes does not fit a UDP audio packet")
    head = HEADER.pack(header.type, header.flags, len(opus), header.ssrc, header.timestamp, header.sequence)
    return head + cipher.apply(head, opus)


def check_packet(data: bytes, *, max_payload: int) -> UdpHeader:
    """The header of a datagram whose size, type and length field are right: all checked before any
    decryption. Raises RemoteProtocolError otherwise (the message says which check failed)."""
    header = UdpHeader.unpack(data)
    if header.type != PACKET_TYPE_AUDIO:
        raise RemoteProtocolError(f"UDP packet of type {header.type:#04x}", close_code_hint=CloseCode.INVALID_DATA)
    if header.length != len(data) - HEADER_SIZE:
        raise RemoteProtocolError(
            f"UDP packet announces {header.length} payload bytes but carries {len(data) - HEADER_SIZE}",
            close_code_hint=CloseCode.INVALID_DATA,
        )
    if header.length > max_payload:
        raise RemoteProtocolError(
            f"UDP payload of {header.length} bytes exceeds {max_payload}", close_code_hint=CloseCode.MESSAGE_TOO_BIG
        )
    return header


def open_payload(cipher: UdpCipher, data: bytes) -> bytes:
    """The decrypted payload of a datagram that passed :func:`check_packet`."""
    return cipher.apply(data[:HEADER_SIZE], data[HEADER_SIZE:])


@dataclass(frozen=True, slots=True)
class UdpKeys:
    """A session's secrets: the AES key and the nonce header the device builds its packets from."""

    key: bytes
    nonce: UdpHeader

    @classmethod
    def generate(cls, ssrc: int | None = None) -> UdpKeys:
        """A random key and a nonce of type 0x01 with ``ssrc`` (random when None), zero elsewhere."""
        ssrc = secrets.randbits(32) if ssrc is None else ssrc
        return cls(key=secrets.token_bytes(KEY_SIZE), nonce=UdpHeader(ssrc=ssrc))

    def params(self, server: str, port: int) -> UdpParams:
        """The server hello's ``udp`` object."""
        return UdpParams(server=server, port=port, key=self.key.hex(), nonce=self.nonce.pack().hex())

    @classmethod
    def from_params(cls, params: UdpParams) -> UdpKeys:
        """What a device keeps from the server hello (the simulator)."""
        return cls(key=bytes.fromhex(params.key), nonce=UdpHeader.unpack(bytes.fromhex(params.nonce)))
