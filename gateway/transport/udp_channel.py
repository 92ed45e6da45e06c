"""One session's UDP audio: the checks on every uplink packet and the sealing of downlink ones.

Sans-I/O (gateway/transport/udp.py owns the socket). An uplink datagram is accepted only when, in
this order (the cheap checks first, nothing decrypted before its size is known to be right):

1. it is at least 16 bytes, of type 0x01, its length field matches its size and is at most
   `transport.udp.max_payload_bytes` (gateway/xiaozhi/udp.py);
2. its sequence is newer than the last accepted one (a late or duplicate packet is dropped and
   counted) and at most `transport.udp.sequence_window` ahead (a forged far-future sequence would
   otherwise lock the device out);
3. its payload decrypts to a plausible Opus packet: mono, of the hello's frame duration. The format
   has no authentication tag, so this is what tells a packet sealed with the session's key from one
   that was not (a random payload passes about once in 75);
4. it comes from the session's address. The first accepted packet sets that address. Packets from
   another address that pass 1-3 move the session there (NAT rebinding) once `REBIND_PACKETS` of
   them in a row, with rising sequences, have come from that same address (the format has no tag:
   one forged packet passes 3 about once in 75, three in a row about once in 400 000); those before
   are held back (dropped as `new_address`). Anything else from another address is dropped.

Sequence gaps are reported as lost packets, which the session gives to the Opus decoder's
concealment (at most `conceal_max_frames` per gap).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from audio_codecs.errors import OpusDecodeError
from audio_codecs.opus import packet_duration_ms
from gateway.xiaozhi import AudioIn, AudioOut, RemoteProtocolError, UdpParams
from gateway.xiaozhi.udp import UdpCipher, UdpHeader, UdpKeys, check_packet, open_payload, seal

Address = tuple[str, int]
REBIND_PACKETS = 3  # valid packets in a row from a new address that move the session there


class Drop(StrEnum):
    """Why an uplink datagram was dropped (the label of `xz_udp_dropped_total`)."""

    MALFORMED = "malformed"  # short, wrong type, wrong length or too long
    UNKNOWN_SESSION = "unknown_session"  # no live session has its ssrc
    LATE = "late"  # sequence at or below the last accepted one (reordered or replayed)
    OUT_OF_WINDOW = "out_of_window"  # sequence too far ahead
    UNDECRYPTABLE = "undecryptable"  # not a plausible Opus packet once decrypted: another key
    ADDRESS = "address"  # from an address that is not the session's, and not a valid newer packet
    NEW_ADDRESS = "new_address"  # valid and newer, from a new address not yet proven (NAT rebinding)
    QUEUE_FULL = "queue_full"  # the session is not keeping up


@dataclass(frozen=True, slots=True)
class Accepted:
    audio: AudioIn
    lost: int  # packets missing right before this one (sequence gap)
    moved_from: Address | None = None  # the address the session had before this packet (NAT rebinding)


def plausible_opus(payload: bytes, frame_ms: int) -> bool:
    """A mono Opus packet of ``frame_ms`` (from its TOC byte and frame count)."""
    if not payload or payload[0] & 0x04:  # empty, or the TOC's stereo flag
        return False
    try:
        return abs(packet_duration_ms(payload) - frame_ms) < 0.01
    except OpusDecodeError:
        return False


class UdpChannel:
    """The UDP side of one MQTT session: its keys, the device's address, the sequences both ways."""

    def __init__(
        self,
        keys: UdpKeys,
        *,
        downlink_ssrc: int,
        frame_ms: int = 60,
        max_payload: int = 1500,
        sequence_window: int = 3000,
    ) -> None:
        self.keys = keys
        self.ssrc = keys.nonce.ssrc  # what the device's uplink headers carry: the session's name
        self.downlink_ssrc = downlink_ssrc  # ours differs, so the two directions never share counter blocks
        self.frame_ms = frame_ms
        self.max_payload = max_payload
        self.sequence_window = sequence_window
        self._cipher = UdpCipher(keys.key)
        self.address: Address | None = None
        self.last_sequence = 0  # the device's first packet is sequence 1
        self.sent_sequence = 0
        self.unsent_logged = False
        self._candidate: Address | None = None  # a new address the device may have moved to
        self._candidate_packets = 0
        self._candidate_sequence = 0

    def params(self, server: str, port: int) -> UdpParams:
        return self.keys.params(server, port)

    def receive(self, data: bytes, address: Address) -> Accepted | Drop:
        try:
            header = check_packet(data, max_payload=self.max_payload)
        except RemoteProtocolError:
            return Drop.MALFORMED
        if header.ssrc != self.ssrc:
            return Drop.UNKNOWN_SESSION
        foreign = self.address is not None and address != self.address
        if header.sequence <= self.last_sequence:
            return Drop.ADDRESS if foreign else Drop.LATE
        if header.sequence - self.last_sequence > self.sequence_window:
            return Drop.ADDRESS if foreign else Drop.OUT_OF_WINDOW
        opus = open_payload(self._cipher, data)
        if not plausible_opus(opus, self.frame_ms):
            return Drop.ADDRESS if foreign else Drop.UNDECRYPTABLE
        moved_from = None
        if foreign:
            if address != self._candidate or header.sequence <= self._candidate_sequence:
                self._candidate, self._candidate_packets = address, 0
            self._candidate_packets += 1
            self._candidate_sequence = header.sequence
            if self._candidate_packets < REBIND_PACKETS:
                return Drop.NEW_ADDRESS
            moved_from = self.address
        self._candidate, self._candidate_packets, self._candidate_sequence = None, 0, 0
        lost = header.sequence - self.last_sequence - 1
        self.last_sequence = header.sequence
        self.address = address
        return Accepted(AudioIn(opus=opus, timestamp_ms=header.timestamp), lost, moved_from)

    def seal(self, packet: AudioOut) -> bytes:
        """The next downlink datagram: sequence + 1, the packet's timestamp, our ssrc."""
        self.sent_sequence = (self.sent_sequence + 1) & 0xFFFFFFFF
        header = UdpHeader(ssrc=self.downlink_ssrc, timestamp=packet.timestamp_ms, sequence=self.sent_sequence,
                           flags=self.keys.nonce.flags)  # fmt: skip
        return seal(self._cipher, header, packet.opus)
