"""Voices as the engine sees them: a preset, a decoded prompt recording, the name of a feature cache file.

A ``VoicePreset`` names a prompt recording and its transcript (plus an optional instruct text); a backend
that clones prepares it once (``Backend.add_voice``) and may keep the prepared features in a cache file
named by ``preset_cache_path`` (the hash covers the wav bytes, the transcript and the backend's model
fingerprint, so an edited preset never reuses stale features). ``decode_prompt_wav`` checks a prompt
recording (size, format, rate >= 16 kHz, 1..30 s) for presets and one-off zero-shot requests alike.

The preset folder (YAML files), uploads and their persistence are the gateway's: ``VoiceStore`` in
gateway/voices/store.py. Nothing here does more file I/O than reading a recording.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audio_codecs.wav import WavFormatError, read_wav
from tts_engine.errors import EngineError

__all__ = [
    "MAX_PROMPT_BYTES",
    "MAX_PROMPT_SECONDS",
    "MIN_PROMPT_SAMPLE_RATE",
    "MIN_PROMPT_SECONDS",
    "PromptAudio",
    "VoiceError",
    "VoicePreset",
    "check_voice_name",
    "decode_prompt_wav",
    "preset_cache_path",
]

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MIN_PROMPT_SECONDS = 1.0
MAX_PROMPT_SECONDS = 30.0
MIN_PROMPT_SAMPLE_RATE = 16000
MAX_PROMPT_BYTES = 16 * 1024 * 1024  # 30 s of 48 kHz stereo float32 is 11.5 MB


class VoiceError(EngineError):
    """A preset or an uploaded voice cannot be used; the message names the file or field."""


@dataclass(frozen=True, slots=True)
class VoicePreset:
    name: str
    prompt_wav: Path | None  # absolute path, or None for a preset without a recording
    prompt_text: str
    instruct: str | None = None
    description: str = ""


@dataclass(frozen=True, slots=True)
class PromptAudio:
    """A decoded prompt recording: float32 mono samples in [-1, 1] at ``sample_rate``."""

    samples: np.ndarray
    sample_rate: int

    @property
    def seconds(self) -> float:
        return self.samples.size / self.sample_rate


def check_voice_name(name: object) -> str:
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise VoiceError(f"voice name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
    return name


def decode_prompt_wav(data: bytes, *, source: str = "prompt wav") -> PromptAudio:
    """Parse and check a prompt recording (size, format, rate >= 16 kHz, 1..30 s); VoiceError names ``source``."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise VoiceError(f"{source}: expected WAV bytes, got {type(data).__name__}")
    if len(data) > MAX_PROMPT_BYTES:
        raise VoiceError(f"{source}: {len(data)} bytes, the limit is {MAX_PROMPT_BYTES}")
    try:
        samples, rate = read_wav(bytes(data))
    except WavFormatError as exc:
        raise VoiceError(f"{source}: not a readable WAV file: {exc}") from exc
    if rate < MIN_PROMPT_SAMPLE_RATE:
        raise VoiceError(f"{source}: sample rate {rate} Hz, at least {MIN_PROMPT_SAMPLE_RATE} Hz needed")
    audio = PromptAudio(np.ascontiguousarray(samples, dtype=np.float32), rate)
    if not MIN_PROMPT_SECONDS <= audio.seconds <= MAX_PROMPT_SECONDS:
        raise VoiceError(
            f"{source}: {audio.seconds:.2f} s long, must be {MIN_PROMPT_SECONDS:g}..{MAX_PROMPT_SECONDS:g} s"
        )
    if not np.isfinite(audio.samples).all():
        raise VoiceError(f"{source}: holds NaN or infinite samples")
    return audio


def preset_cache_path(preset: VoicePreset, cache_dir: Path, *, key: str = "") -> Path:
    """``cache_dir/<name>.<hash>.safetensors``; the hash covers the prompt wav's bytes, the transcript and
    ``key`` (a backend puts its model's fingerprint there), so any change gives a new file."""
    digest = hashlib.sha256()
    if preset.prompt_wav is not None:
        try:
            digest.update(preset.prompt_wav.read_bytes())
        except OSError as exc:
            raise VoiceError(f"voice {preset.name!r}: cannot read {preset.prompt_wav}: {exc}") from exc
    for part in (preset.prompt_text, key):
        digest.update(b"\0" + part.encode("utf-8"))
    return Path(cache_dir) / f"{preset.name}.{digest.hexdigest()[:16]}.safetensors"
