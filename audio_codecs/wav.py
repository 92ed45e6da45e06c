"""WAV containers: write 16-bit PCM, a header for streamed WAV, and read common WAV files.

Writing uses the stdlib ``wave`` module. Reading uses a small RIFF chunk walk instead,
because ``wave`` on Python 3.11 rejects IEEE-float and WAVE_FORMAT_EXTENSIBLE files, and
streamed WAV (sizes 0xFFFFFFFF) must be read up to the bytes actually present.
"""

from __future__ import annotations

import io
import numbers
import struct
import wave
from os import PathLike
from pathlib import Path

import numpy as np

from audio_codecs.errors import WavFormatError

__all__ = ["WavFormatError", "float_to_int16", "read_wav", "streaming_wav_header", "wav_bytes"]

_WAVE_FORMAT_PCM = 0x0001
_WAVE_FORMAT_IEEE_FLOAT = 0x0003
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE
_UNKNOWN_SIZE = 0xFFFFFFFF
MAX_SAMPLE_RATE = 768_000  # the highest rate audio hardware records at; anything above is a corrupt header


def float_to_int16(x: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] to int16: scaled by 32768, rounded, clipped; NaN becomes 0.

    The scale matches ``read_wav`` (int16 / 32768), so int16 -> float -> int16 is exact.
    """
    samples = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(np.rint(samples * 32768.0), -32768, 32767).astype(np.int16)


def wav_bytes(pcm_int16: np.ndarray, sample_rate: int) -> bytes:
    """A complete 16-bit PCM WAV file; ``pcm_int16`` is [T] (mono) or [T, channels]."""
    if not isinstance(pcm_int16, np.ndarray) or pcm_int16.dtype != np.int16:
        raise TypeError("wav_bytes needs a numpy int16 array (see float_to_int16)")
    if pcm_int16.ndim not in (1, 2) or (pcm_int16.ndim == 2 and pcm_int16.shape[1] < 1):
        raise ValueError(f"PCM must be [T] or [T, channels], got shape {pcm_int16.shape}")
    _check_rate(sample_rate)
    channels = 1 if pcm_int16.ndim == 1 else pcm_int16.shape[1]
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(2)
        writer.setframerate(sample_rate)
        writer.writeframes(np.ascontiguousarray(pcm_int16, dtype="<i2").tobytes())
    return buffer.getvalue()


def streaming_wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A 44-byte PCM WAV header whose RIFF and data sizes are 0xFFFFFFFF (length unknown)."""
    _check_rate(sample_rate)
    if not 1 <= channels <= 65535:
        raise ValueError(f"channels must be within 1..65535, got {channels!r}")
    if bits not in (8, 16, 24, 32):
        raise ValueError(f"bits must be 8, 16, 24 or 32, got {bits!r}")
    block_align = channels * bits // 8
    fmt = struct.pack(
        "<HHIIHH", _WAVE_FORMAT_PCM, channels, sample_rate, sample_rate * block_align, block_align, bits
    )
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN_SIZE)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", _UNKNOWN_SIZE)
    )


def read_wav(data: bytes | bytearray | memoryview | str | PathLike[str]) -> tuple[np.ndarray, int]:
    """Decode a WAV file to (float32 mono samples in [-1, 1], sample_rate).

    Accepts the file's bytes or a path. Reads PCM 8/16/24/32-bit integer and 32/64-bit
    float, plain or WAVE_FORMAT_EXTENSIBLE; channels are averaged. Raises
    ``WavFormatError`` (a ``ValueError``) for anything else.
    """
    raw = bytes(data) if isinstance(data, bytes | bytearray | memoryview) else Path(data).read_bytes()
    fmt_chunk, payload = _find_chunks(raw)
    format_tag, channels, sample_rate, _, block_align, bits = struct.unpack_from("<HHIIHH", fmt_chunk)
    if format_tag == _WAVE_FORMAT_EXTENSIBLE:
        if len(fmt_chunk) < 40:
            raise WavFormatError("WAVE_FORMAT_EXTENSIBLE fmt chunk is shorter than 40 bytes")
        format_tag = struct.unpack_from("<H", fmt_chunk, 24)[0]  # first two bytes of the SubFormat GUID
    if channels < 1:
        raise WavFormatError(f"WAV declares {channels} channels")
    if not 1 <= sample_rate <= MAX_SAMPLE_RATE:
        raise WavFormatError(
            f"WAV declares a sample rate of {sample_rate} Hz; accepted: 1..{MAX_SAMPLE_RATE} Hz"
        )
    if bits < 8 or bits % 8 or block_align != channels * bits // 8:
        raise WavFormatError(f"unsupported WAV layout: {bits} bits, block_align {block_align}")
    sample_width = bits // 8
    usable = len(payload) - len(payload) % block_align
    samples = _decode_samples(payload[:usable], format_tag, sample_width)
    mono = samples.reshape(-1, channels).mean(axis=1, dtype=np.float64) if channels > 1 else samples
    return mono.astype(np.float32, copy=False), int(sample_rate)


def _check_rate(sample_rate: int) -> None:
    if not isinstance(sample_rate, numbers.Integral) or not 1 <= sample_rate <= 0xFFFFFFFF:
        raise ValueError(f"sample_rate must be a positive int, got {sample_rate!r}")


def _find_chunks(raw: bytes) -> tuple[bytes, bytes]:
    """The ``fmt `` chunk body and the ``data`` chunk body (clamped to the bytes present)."""
    if len(raw) < 12 or raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise WavFormatError("not a RIFF/WAVE file")
    fmt_chunk: bytes | None = None
    pos = 12
    while pos + 8 <= len(raw):
        chunk_id = raw[pos : pos + 4]
        size = struct.unpack_from("<I", raw, pos + 4)[0]
        body_start = pos + 8
        if chunk_id == b"fmt ":
            fmt_chunk = raw[body_start : body_start + size]
            if len(fmt_chunk) < 16:
                raise WavFormatError("WAV fmt chunk is shorter than 16 bytes")
        elif chunk_id == b"data":
            if fmt_chunk is None:
                raise WavFormatError("WAV data chunk comes before the fmt chunk")
            return fmt_chunk, raw[body_start : body_start + size]
        pos = body_start + size + (size & 1)  # chunks are padded to an even size
    raise WavFormatError("WAV file has no fmt chunk" if fmt_chunk is None else "WAV file has no data chunk")


def _decode_samples(payload: bytes, format_tag: int, sample_width: int) -> np.ndarray:
    """Interleaved samples as float (float32, or float64 for 64-bit float input)."""
    if format_tag == _WAVE_FORMAT_IEEE_FLOAT and sample_width in (4, 8):
        return np.frombuffer(payload, dtype=f"<f{sample_width}")
    if format_tag != _WAVE_FORMAT_PCM:
        raise WavFormatError(f"unsupported WAV format tag 0x{format_tag:04x} with {8 * sample_width} bits")
    if sample_width == 1:  # 8-bit WAV is unsigned
        return (np.frombuffer(payload, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if sample_width == 2:
        return np.frombuffer(payload, dtype="<i2").astype(np.float32) / 32768.0
    if sample_width == 3:
        bytes3 = np.frombuffer(payload, dtype=np.uint8).reshape(-1, 3)
        padded = np.zeros((bytes3.shape[0], 4), dtype=np.uint8)
        padded[:, 1:] = bytes3  # little-endian: the 24 bits go to the top of an int32
        return (padded.view("<i4")[:, 0] >> 8).astype(np.float32) / 8388608.0
    if sample_width == 4:
        return (np.frombuffer(payload, dtype="<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
    raise WavFormatError(f"unsupported PCM sample width: {8 * sample_width} bits")
