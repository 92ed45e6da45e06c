"""Voice presets: YAML files in one folder, each naming a prompt recording and its transcript.

A preset ``voices/<name>.yaml`` holds::

    name: default            # [A-Za-z0-9_-]{1,64}, equal to the file stem
    prompt_wav: default.wav  # relative to the folder, or absolute; >= 16 kHz, 1..30 s, channels mixed to mono
    prompt_text: "..."       # transcript of prompt_wav (zero-shot cloning); empty: cross-lingual mode
    instruct: null           # optional instruct text (e.g. "用四川话说"); set: instruct mode by default
    description: ""          # optional
    fallback: espeak         # optional: prompt_wav missing -> speak prompt_text with espeak-ng instead

``VoiceStore`` validates every preset at ``load()``, adds uploaded voices atomically (``<name>.wav`` and
``<name>.yaml`` written through temporary files) and names the cache file a backend keeps prepared
features in: ``.cache/<name>.<hash>.safetensors``, the hash covering the wav bytes and the transcript,
so an edited preset never reuses stale features.

The store does file I/O only; it is used on the event loop at start-up and from upload handlers, and
by backends (``cache_path``) in the engine thread. Nothing here knows about models.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from audio_codecs.wav import WavFormatError, read_wav
from tts_engine.errors import EngineError, UnknownVoice

__all__ = [
    "MAX_PROMPT_BYTES",
    "MAX_PROMPT_SECONDS",
    "MIN_PROMPT_SAMPLE_RATE",
    "MIN_PROMPT_SECONDS",
    "PromptAudio",
    "VoiceError",
    "VoiceExists",
    "VoicePreset",
    "VoiceStore",
    "check_voice_name",
    "decode_prompt_wav",
    "preset_cache_path",
]

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MIN_PROMPT_SECONDS = 1.0
MAX_PROMPT_SECONDS = 30.0
MIN_PROMPT_SAMPLE_RATE = 16000
MAX_PROMPT_BYTES = 16 * 1024 * 1024  # 30 s of 48 kHz stereo float32 is 11.5 MB
MAX_TEXT_CHARS = 1000
CACHE_DIR = ".cache"
_KEYS = {"name", "prompt_wav", "prompt_text", "instruct", "description", "fallback"}
_FALLBACKS = ("espeak",)


class VoiceError(EngineError):
    """A preset or an uploaded voice cannot be used; the message names the file or field."""


class VoiceExists(VoiceError):
    """``VoiceStore.add()`` without ``overwrite`` for a name that is taken."""


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


def _optional_text(data: dict[str, Any], key: str, source: Path, *, default: str | None) -> str | None:
    value = data.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str):
        raise VoiceError(f"{source}: field {key!r} must be a string, got {type(value).__name__}")
    if len(value) > MAX_TEXT_CHARS:
        raise VoiceError(f"{source}: field {key!r} is longer than {MAX_TEXT_CHARS} characters")
    return value.strip()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class VoiceStore:
    """The presets of one folder (``voices/``), plus uploads and the feature-cache names."""

    def __init__(self, directory: str | Path, *, espeak_executable: str = "espeak-ng") -> None:
        self.directory = Path(directory).resolve()
        self.cache_dir = self.directory / CACHE_DIR
        self.espeak_executable = espeak_executable
        self._presets: dict[str, VoicePreset] = {}

    # -- reading -------------------------------------------------------------------------------

    def load(self, *, strict: bool = False) -> list[VoicePreset]:
        """(Re)read every ``*.yaml``; a bad one is logged and skipped, or raises VoiceError with ``strict``."""
        presets: dict[str, VoicePreset] = {}
        if self.directory.is_dir():
            for path in sorted(self.directory.glob("*.yaml")):
                try:
                    preset = self._read_preset(path)
                except VoiceError as exc:
                    if strict:
                        raise
                    log.error("skipping voice preset: %s", exc)
                    continue
                presets[preset.name] = preset
        elif strict:
            raise VoiceError(f"{self.directory}: voice folder not found")
        self._presets = presets
        return self.list()

    def list(self) -> list[VoicePreset]:
        return [self._presets[name] for name in sorted(self._presets)]

    def names(self) -> list[str]:
        return sorted(self._presets)

    def get(self, name: str) -> VoicePreset:
        preset = self._presets.get(name)
        if preset is None:
            raise UnknownVoice(name, self.names())
        return preset

    def __contains__(self, name: object) -> bool:
        return name in self._presets

    def _read_preset(self, path: Path) -> VoicePreset:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise VoiceError(f"{path}: unreadable YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise VoiceError(f"{path}: expected a mapping of preset fields")
        unknown = set(data) - _KEYS
        if unknown:
            raise VoiceError(f"{path}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}")
        name = data.get("name", path.stem)
        if name != path.stem:
            raise VoiceError(f"{path}: field 'name' is {name!r} but must equal the file stem {path.stem!r}")
        try:
            check_voice_name(name)
        except VoiceError as exc:
            raise VoiceError(f"{path}: {exc}") from exc
        prompt_text = _optional_text(data, "prompt_text", path, default="") or ""
        instruct = _optional_text(data, "instruct", path, default=None) or None
        description = _optional_text(data, "description", path, default="") or ""
        fallback = data.get("fallback")
        if fallback is not None and fallback not in _FALLBACKS:
            raise VoiceError(f"{path}: field 'fallback' must be one of {list(_FALLBACKS)} or null")
        wav_field = data.get("prompt_wav")
        wav: Path | None = None
        if wav_field is not None:
            if not isinstance(wav_field, str) or not wav_field:
                raise VoiceError(f"{path}: field 'prompt_wav' must be a file name")
            wav = (self.directory / wav_field).resolve()
            if not wav.is_file():
                if fallback != "espeak":
                    raise VoiceError(f"{path}: field 'prompt_wav': {wav} not found")
                wav = self._espeak_prompt(name, prompt_text, path, wav)
            try:
                decode_prompt_wav(wav.read_bytes(), source=f"{path}: field 'prompt_wav' ({wav})")
            except OSError as exc:
                raise VoiceError(f"{path}: field 'prompt_wav': cannot read {wav}: {exc}") from exc
        return VoicePreset(name, wav, prompt_text, instruct, description)

    def _espeak_prompt(self, name: str, prompt_text: str, source: Path, missing: Path) -> Path:
        """Speak ``prompt_text`` with espeak-ng into the cache folder: a robotic stand-in recording."""
        from tts_engine.backends.espeak import AUTO_VOICE, resolve_voice  # only when a fallback is needed

        if not prompt_text:
            raise VoiceError(
                f"{source}: prompt_wav {missing} is missing and there is no prompt_text to speak"
            )
        executable = shutil.which(self.espeak_executable)
        if executable is None:
            raise VoiceError(f"{source}: prompt_wav {missing} is missing and espeak-ng is not installed")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(prompt_text.encode("utf-8")).hexdigest()[:16]
        target = self.cache_dir / f"{name}.espeak.{digest}.wav"
        if not target.is_file():
            command = [executable, "--stdout", "-v", resolve_voice(AUTO_VOICE, prompt_text), "-s", "150"]
            try:
                done = subprocess.run(
                    command, input=prompt_text.encode("utf-8"), capture_output=True, timeout=30
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise VoiceError(f"{source}: espeak-ng fallback failed: {exc}") from exc
            if done.returncode != 0 or not done.stdout:
                message = done.stderr.decode("utf-8", "replace").strip()
                raise VoiceError(f"{source}: espeak-ng fallback failed: {message or done.returncode}")
            _atomic_write(target, done.stdout)
        log.warning(
            "voice %r: %s is missing; using a robotic espeak-ng recording of its prompt_text instead "
            "(run scripts/download_model.py to fetch the real prompt)",
            name,
            missing,
        )
        return target

    # -- writing -------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        wav_bytes: bytes,
        prompt_text: str,
        *,
        instruct: str | None = None,
        description: str = "",
        overwrite: bool = False,
    ) -> VoicePreset:
        """Check an uploaded recording and save it as ``<name>.wav`` + ``<name>.yaml``."""
        check_voice_name(name)
        for key, value in (
            ("prompt_text", prompt_text),
            ("instruct", instruct),
            ("description", description),
        ):
            if value is not None and not isinstance(value, str):
                raise VoiceError(f"voice {name!r}: {key} must be a string")
            if value is not None and len(value) > MAX_TEXT_CHARS:
                raise VoiceError(f"voice {name!r}: {key} is longer than {MAX_TEXT_CHARS} characters")
        if name in self._presets and not overwrite:
            raise VoiceExists(f"voice {name!r} already exists")
        yaml_path = self.directory / f"{name}.yaml"
        if yaml_path.exists() and not overwrite:
            raise VoiceExists(f"voice {name!r} already exists ({yaml_path})")
        decode_prompt_wav(wav_bytes, source=f"voice {name!r}: uploaded wav")
        self.directory.mkdir(parents=True, exist_ok=True)
        wav_path = self.directory / f"{name}.wav"
        fields = {
            "name": name,
            "prompt_wav": wav_path.name,
            "prompt_text": prompt_text.strip(),
            "instruct": (instruct or "").strip() or None,
            "description": description.strip(),
        }
        _atomic_write(wav_path, bytes(wav_bytes))
        _atomic_write(yaml_path, yaml.safe_dump(fields, allow_unicode=True, sort_keys=False).encode("utf-8"))
        preset = VoicePreset(name, wav_path, fields["prompt_text"], fields["instruct"], fields["description"])
        self._presets[name] = preset
        return preset

    def remove(self, name: str) -> None:
        """Delete the preset's YAML, its own wav (``<name>.wav`` in the folder) and its cached features."""
        preset = self.get(name)
        (self.directory / f"{name}.yaml").unlink(missing_ok=True)
        own_wav = self.directory / f"{name}.wav"
        others = [p for n, p in self._presets.items() if n != name]
        if preset.prompt_wav == own_wav and all(p.prompt_wav != own_wav for p in others):
            own_wav.unlink(missing_ok=True)
        if self.cache_dir.is_dir():
            for cached in self.cache_dir.glob(f"{name}.*"):
                if cached.name.split(".", 1)[0] == name:
                    cached.unlink(missing_ok=True)
        del self._presets[name]

    # -- cache ---------------------------------------------------------------------------------

    def cache_path(self, name: str, *, key: str = "") -> Path:
        """Where prepared features of ``name`` live: ``.cache/<name>.<hash>.safetensors`` (see ``preset_cache_path``)."""
        return preset_cache_path(self.get(name), self.cache_dir, key=key)


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
