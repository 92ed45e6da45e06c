"""Exceptions raised by the audio codecs."""


class AudioCodecError(Exception):
    """Base class for errors raised by ``audio_codecs``."""


class OpusDecodeError(AudioCodecError):
    """An Opus packet could not be decoded (corrupt, truncated or not Opus)."""


class WavFormatError(AudioCodecError, ValueError):
    """Bytes that are not a WAV file this package can read."""
