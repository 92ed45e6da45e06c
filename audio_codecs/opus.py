"""Opus encode/decode over libopus (through opuslib-next), mono 16-bit PCM.

No I/O and no asyncio: the encoder turns PCM into whole-frame packets and keeps the
remainder for the next call; the decoder turns one packet into PCM.

Encoder defaults follow the incumbent Xiaozhi server's downlink: application VOIP,
voice signal type, 60 ms frames, 24 kbit/s (VBR), complexity 10.
"""

from __future__ import annotations

import numpy as np
import opuslib_next
import opuslib_next.api.decoder as _opus_decoder_api

from audio_codecs.errors import OpusDecodeError

__all__ = [
    "OPUS_FRAME_MS",
    "OPUS_SAMPLE_RATES",
    "OpusDecodeError",
    "OpusDecoder",
    "OpusEncoder",
    "packet_duration_ms",
]

OPUS_SAMPLE_RATES: tuple[int, ...] = (8000, 12000, 16000, 24000, 48000)
OPUS_FRAME_MS: tuple[int, ...] = (10, 20, 40, 60)
_MAX_PACKET_MS = 120  # the longest packet Opus allows


def _check_sample_rate(sample_rate: int) -> None:
    if sample_rate not in OPUS_SAMPLE_RATES:
        raise ValueError(f"Opus sample_rate must be one of {OPUS_SAMPLE_RATES}, got {sample_rate!r}")


def _as_int16_pcm(pcm: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    """1-D int16 samples from an int16 array or from s16le bytes."""
    if isinstance(pcm, bytes | bytearray | memoryview):
        raw = bytes(pcm)
        if len(raw) % 2:
            raise ValueError(f"s16le PCM must have an even number of bytes, got {len(raw)}")
        return np.frombuffer(raw, dtype="<i2").astype(np.int16, copy=False)
    if not isinstance(pcm, np.ndarray):
        raise TypeError(f"PCM must be a numpy int16 array or s16le bytes, got {type(pcm).__name__}")
    if pcm.dtype != np.int16:
        raise TypeError(f"PCM array must have dtype int16, got {pcm.dtype} (see wav.float_to_int16)")
    if pcm.ndim != 1:
        raise ValueError(f"PCM array must be 1-D (mono), got shape {pcm.shape}")
    return pcm


class OpusEncoder:
    """Mono Opus encoder with exact framing.

    ``encode()`` returns one packet per complete frame and keeps the leftover samples,
    so any split of a stream into chunks yields the same packets as one call.
    ``flush()`` pads the final partial frame with silence (end of stream only).
    """

    def __init__(
        self,
        sample_rate: int,
        frame_ms: int = 60,
        *,
        bitrate: int = 24000,
        complexity: int = 10,
    ) -> None:
        _check_sample_rate(sample_rate)
        if frame_ms not in OPUS_FRAME_MS:
            raise ValueError(f"Opus frame_ms must be one of {OPUS_FRAME_MS}, got {frame_ms!r}")
        if not 500 <= bitrate <= 512_000:
            raise ValueError(f"Opus bitrate must be within 500..512000 bit/s, got {bitrate!r}")
        if not 0 <= complexity <= 10:
            raise ValueError(f"Opus complexity must be within 0..10, got {complexity!r}")
        self.sample_rate = sample_rate
        self.frame_ms = frame_ms
        self.frame_samples = sample_rate * frame_ms // 1000
        self._encoder = opuslib_next.Encoder(sample_rate, 1, opuslib_next.APPLICATION_VOIP)
        self._encoder.signal = opuslib_next.SIGNAL_VOICE
        self._encoder.bitrate = bitrate
        self._encoder.complexity = complexity
        self._pending = np.zeros(0, dtype=np.int16)

    @property
    def pending_samples(self) -> int:
        """Samples held back because they do not yet fill a frame."""
        return int(self._pending.shape[0])

    def encode(self, pcm: np.ndarray | bytes | bytearray | memoryview) -> list[bytes]:
        """Packets for every complete frame of (pending + ``pcm``); keeps the rest."""
        samples = _as_int16_pcm(pcm)
        if self._pending.shape[0]:
            samples = np.concatenate([self._pending, samples])
        num_frames = samples.shape[0] // self.frame_samples
        end = num_frames * self.frame_samples
        packets = [
            self._encode_frame(samples[i : i + self.frame_samples]) for i in range(0, end, self.frame_samples)
        ]
        self._pending = samples[end:].copy()
        return packets

    def flush(self) -> list[bytes]:
        """Encode the pending partial frame padded with silence; [] if nothing is pending."""
        if not self._pending.shape[0]:
            return []
        frame = np.zeros(self.frame_samples, dtype=np.int16)
        frame[: self._pending.shape[0]] = self._pending
        self._pending = np.zeros(0, dtype=np.int16)
        return [self._encode_frame(frame)]

    def clear(self) -> None:
        """Drop pending samples and reset the codec state (bitrate etc. are kept)."""
        self._pending = np.zeros(0, dtype=np.int16)
        self._encoder.reset_state()

    def _encode_frame(self, frame: np.ndarray) -> bytes:
        return self._encoder.encode(np.ascontiguousarray(frame, dtype="<i2").tobytes(), self.frame_samples)


class OpusDecoder:
    """Stateful mono Opus decoder (one per connection).

    Decodes a packet of any legal duration (2.5 to 120 ms) to int16 PCM at ``sample_rate``.
    """

    def __init__(self, sample_rate: int = 16000) -> None:
        _check_sample_rate(sample_rate)
        self.sample_rate = sample_rate
        self._max_frame_samples = sample_rate * _MAX_PACKET_MS // 1000
        self._decoder = opuslib_next.Decoder(sample_rate, 1)

    def decode(self, packet: bytes | bytearray | memoryview) -> np.ndarray:
        """PCM of one packet; an empty packet gives an empty array.

        Raises ``OpusDecodeError`` for a packet libopus rejects.
        """
        if not isinstance(packet, bytes | bytearray | memoryview):
            raise TypeError(f"Opus packet must be bytes, got {type(packet).__name__}")
        data = bytes(packet)
        if not data:
            return np.zeros(0, dtype=np.int16)
        try:
            pcm = self._decoder.decode(data, self._max_frame_samples)
        except opuslib_next.OpusError as exc:
            raise OpusDecodeError(f"cannot decode Opus packet of {len(data)} bytes: {exc}") from exc
        return np.frombuffer(pcm, dtype=np.int16).copy()

    def conceal(self, samples: int) -> np.ndarray:
        """libopus's packet-loss concealment for one lost packet of ``samples`` samples (a multiple of
        2.5 ms, at most 120 ms): audio extrapolated from the history, fading to silence over longer gaps."""
        if not 0 < samples <= self._max_frame_samples or (samples * 400) % self.sample_rate:
            raise ValueError(f"cannot conceal {samples} samples at {self.sample_rate} Hz")
        try:  # a NULL packet is libopus's "this packet was lost"
            pcm = _opus_decoder_api.decode(self._decoder.decoder_state, None, 0, samples, False, channels=1)
        except opuslib_next.OpusError as exc:
            raise OpusDecodeError(f"cannot conceal a lost packet: {exc}") from exc
        return np.frombuffer(pcm, dtype=np.int16).copy()

    def reset(self) -> None:
        """Forget the decoder history (start of a new stream)."""
        self._decoder.reset_state()


def packet_duration_ms(packet: bytes | bytearray | memoryview, sample_rate: int = 48000) -> float:
    """Duration of an Opus packet, read from its TOC byte (and frame count byte).

    ``sample_rate`` only has to be a valid Opus rate: every Opus duration is a whole number
    of samples at every Opus rate, so the result does not depend on it.
    Raises ``OpusDecodeError`` for an empty or malformed packet.
    """
    _check_sample_rate(sample_rate)
    data = bytes(packet)
    if not data:
        raise OpusDecodeError("empty Opus packet has no duration")
    try:
        num_frames = _opus_decoder_api.packet_get_nb_frames(data, len(data))
        samples_per_frame = _opus_decoder_api.packet_get_samples_per_frame(data, sample_rate)
    except opuslib_next.OpusError as exc:
        raise OpusDecodeError(f"malformed Opus packet of {len(data)} bytes: {exc}") from exc
    return num_frames * samples_per_frame * 1000 / sample_rate
