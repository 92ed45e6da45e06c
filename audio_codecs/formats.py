"""Audio file formats for the HTTP API: WAV and raw PCM here, mp3 / Ogg Opus / FLAC / AAC through PyAV.

Why PyAV (``av`` on PyPI): it bundles FFmpeg with libmp3lame, libopus, FLAC and AAC inside its wheels, and
one abi3 wheel (``cp311-abi3-manylinux_2_28_x86_64``) installs on Python 3.11 and 3.12 without a system
FFmpeg or a compiler. lameenc covers only mp3, and soundfile's libsndfile has no AAC. PyAV is imported
only when a compressed format is used, so WAV and PCM work without it.

Two shapes:

- ``encode_audio(pcm, sample_rate, fmt)`` returns a whole file (WAV with exact sizes).
- ``StreamingEncoder(fmt, sample_rate)`` turns PCM chunks into container bytes as soon as the codec
  has them (WAV with a streaming header, raw PCM, mp3 frames, Ogg pages of about 60 ms, FLAC frames,
  ADTS AAC frames); ``finish()`` returns the tail. Concatenated, its output is a playable file.

PCM is mono int16 throughout.
"""

from __future__ import annotations

import io
from types import ModuleType
from typing import Any

import numpy as np

from audio_codecs.errors import AudioCodecError
from audio_codecs.wav import read_wav, streaming_wav_header, wav_bytes

__all__ = [
    "AUDIO_FORMATS",
    "CONTENT_TYPES",
    "StreamingEncoder",
    "UnsupportedFormat",
    "check_format",
    "decode_audio",
    "encode_audio",
]

AUDIO_FORMATS: tuple[str, ...] = ("wav", "pcm", "mp3", "opus", "flac", "aac")

CONTENT_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",  # headerless s16le mono; the rate goes in the X-Sample-Rate header
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "flac": "audio/flac",
    "aac": "audio/aac",
}

# format -> (FFmpeg muxer, FFmpeg encoder, bit rate or None for lossless)
_PYAV_FORMATS: dict[str, tuple[str, str, int | None]] = {
    "mp3": ("mp3", "libmp3lame", 64_000),
    "opus": ("ogg", "libopus", 32_000),
    "flac": ("flac", "flac", None),
    "aac": ("adts", "aac", 64_000),
}

_RATES: dict[str, tuple[int, ...] | None] = {
    "wav": None,
    "pcm": None,
    "flac": None,
    "mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
    "opus": (8000, 12000, 16000, 24000, 48000),
    "aac": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000),
}

_MAX_DECODE_RATE = 768_000  # as audio_codecs.wav.MAX_SAMPLE_RATE
_OGG_PAGE_US = 60_000  # Ogg pages are written every ~60 ms instead of FFmpeg's 1 s: streams stay live


class UnsupportedFormat(AudioCodecError, ValueError):
    """An audio format (or a format and sample-rate pair) this package cannot write."""


def check_format(fmt: str, sample_rate: int) -> None:
    """Raise ``UnsupportedFormat`` unless ``fmt`` can be written at ``sample_rate``."""
    if fmt not in AUDIO_FORMATS:
        raise UnsupportedFormat(f"unsupported audio format {fmt!r}; supported: {', '.join(AUDIO_FORMATS)}")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate < 1:
        raise UnsupportedFormat(f"sample_rate must be a positive int, got {sample_rate!r}")
    rates = _RATES[fmt]
    if rates is not None and sample_rate not in rates:
        raise UnsupportedFormat(
            f"{fmt} cannot be written at {sample_rate} Hz; use one of {', '.join(map(str, rates))}"
        )


def encode_audio(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole file of ``fmt`` holding mono int16 ``pcm``."""
    check_format(fmt, sample_rate)
    pcm = _mono_int16(pcm)
    if fmt == "wav":
        return wav_bytes(pcm, sample_rate)
    if fmt == "pcm":
        return pcm.astype("<i2", copy=False).tobytes()
    buffer = io.BytesIO()  # seekable: muxers that rewrite their header at the end (FLAC) can
    encoder = _PyAVEncoder(fmt, sample_rate, buffer)
    encoder.encode(pcm)
    encoder.close()
    return buffer.getvalue()


class StreamingEncoder:
    """Incremental encoder: ``encode(chunk)`` returns the bytes ready now (maybe none), ``finish()`` the rest."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        check_format(fmt, sample_rate)
        self.format = fmt
        self.sample_rate = sample_rate
        self.content_type = CONTENT_TYPES[fmt]
        self._pending = streaming_wav_header(sample_rate) if fmt == "wav" else b""
        self._sink = _ChunkSink()
        self._codec = _PyAVEncoder(fmt, sample_rate, self._sink) if fmt in _PYAV_FORMATS else None
        self._is_finished = False

    def encode(self, pcm: np.ndarray) -> bytes:
        if self._is_finished:
            raise AudioCodecError("encoder already finished")
        pcm = _mono_int16(pcm)
        head, self._pending = self._pending, b""
        if self._codec is None:
            return head + pcm.astype("<i2", copy=False).tobytes()
        self._codec.encode(pcm)
        return head + self._sink.take()

    def finish(self) -> bytes:
        """The tail of the file (codec delay, last frames, trailers). Call once, at the end."""
        if self._is_finished:
            return b""
        self._is_finished = True
        head, self._pending = self._pending, b""
        if self._codec is None:
            return head
        self._codec.close()
        return head + self._sink.take()


def decode_audio(data: bytes, *, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Any audio file (WAV natively, anything FFmpeg reads through PyAV) -> (float32 mono, sample_rate).

    Undecodable input raises ``AudioCodecError`` (``WavFormatError`` for a bad WAV). With
    ``max_seconds``, a compressed file stops being decoded once it holds more than that much audio
    (a few kB of FLAC or mp3 can expand to hours): the caller sees the over-long result and refuses it.
    """
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return read_wav(data)
    av = _import_av("decoding non-WAV audio")
    pieces: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise AudioCodecError("the file holds no audio stream")
            stream = container.streams.audio[0]
            rate = int(stream.rate or 0)
            if not 1 <= rate <= _MAX_DECODE_RATE:
                raise AudioCodecError(f"the audio stream declares a sample rate of {rate} Hz")
            limit = None if max_seconds is None else int(max_seconds * rate) + 1
            num_samples = 0
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    pieces.append(out.to_ndarray().reshape(-1))
                    num_samples += pieces[-1].size
                if limit is not None and num_samples > limit:
                    break
            else:
                for out in resampler.resample(None):
                    pieces.append(out.to_ndarray().reshape(-1))
    except (av.FFmpegError, ValueError, OverflowError) as exc:
        raise AudioCodecError(f"cannot decode audio: {exc}") from exc
    samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    return samples.astype(np.float32, copy=False), rate


class _ChunkSink:
    """A write-only file for PyAV: no ``seek``, so muxers stream instead of rewriting headers."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        return len(chunk)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class _PyAVEncoder:
    """One FFmpeg muxer + encoder writing to ``sink``; PyAV resamples s16 frames to the codec's layout."""

    def __init__(self, fmt: str, sample_rate: int, sink: Any) -> None:
        av = _import_av(f"the {fmt} format")
        muxer, codec, bit_rate = _PYAV_FORMATS[fmt]
        options = {"page_duration": str(_OGG_PAGE_US)} if muxer == "ogg" else {}
        self._av = av
        self._sample_rate = sample_rate
        self._container = av.open(sink, mode="w", format=muxer, options=options)
        self._stream = self._container.add_stream(codec, rate=sample_rate)
        self._stream.layout = "mono"
        if bit_rate is not None:
            self._stream.bit_rate = bit_rate
        self._pts = 0

    def encode(self, pcm: np.ndarray) -> None:
        if pcm.size == 0:
            return
        frame = self._av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self._sample_rate
        frame.pts = self._pts
        self._pts += pcm.size
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def close(self) -> None:
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()


def _import_av(purpose: str) -> ModuleType:
    try:
        import av
    except ImportError as exc:  # pragma: no cover - av is a declared dependency
        raise UnsupportedFormat(f"{purpose} needs PyAV: pip install av") from exc
    return av


def _mono_int16(pcm: np.ndarray) -> np.ndarray:
    if not isinstance(pcm, np.ndarray) or pcm.dtype != np.int16:
        raise TypeError("PCM must be a numpy int16 array")
    if pcm.ndim != 1:
        raise ValueError(f"PCM must be 1-D (mono), got shape {pcm.shape}")
    return pcm
