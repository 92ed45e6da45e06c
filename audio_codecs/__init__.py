"""Audio containers and codecs: Opus packets, WAV files. Imports nothing of ours.

Submodules load on first use, so `audio_codecs.wav` works on a machine without
libopus/opuslib (the GPU benchmark box imports tts_engine, which reads WAVs).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AudioCodecError": "audio_codecs.errors",
    "OpusDecodeError": "audio_codecs.errors",
    "WavFormatError": "audio_codecs.errors",
    "OpusDecoder": "audio_codecs.opus",
    "OpusEncoder": "audio_codecs.opus",
    "packet_duration_ms": "audio_codecs.opus",
    "float_to_int16": "audio_codecs.wav",
    "read_wav": "audio_codecs.wav",
    "streaming_wav_header": "audio_codecs.wav",
    "wav_bytes": "audio_codecs.wav",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'audio_codecs' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
