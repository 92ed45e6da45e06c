"""The files of a voice preset: reading one (``voices/<name>.yaml``, its fields checked, its recording
decoded) and writing a file atomically.

The format is described in gateway/voices/store.py. A preset whose recording is missing may say
``fallback: espeak``: its ``prompt_text`` is then spoken by espeak-ng into the cache folder, a robotic
stand-in recording, so a fresh install talks before the real prompts are downloaded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tts_engine.voices import MAX_PROMPT_BYTES, VoiceError, VoicePreset, check_voice_name, decode_prompt_wav

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 1000
MAX_PRESET_BYTES = 64 * 1024  # a preset YAML is a few lines
KEYS = {"name", "prompt_wav", "prompt_text", "instruct", "description", "fallback"}
FALLBACKS = ("espeak",)


def atomic_write(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never a part: a synced temporary file renamed over it."""
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
    sync_dir(path.parent)


def sync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def optional_text(data: dict[str, Any], key: str, source: Path, *, default: str | None) -> str | None:
    value = data.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str):
        raise VoiceError(f"{source}: field {key!r} must be a string, got {type(value).__name__}")
    if len(value) > MAX_TEXT_CHARS:
        raise VoiceError(f"{source}: field {key!r} is longer than {MAX_TEXT_CHARS} characters")
    return value.strip()


def read_preset(path: Path, directory: Path, cache_dir: Path, espeak_executable: str) -> VoicePreset:
    """One preset YAML, checked: its fields, its name, its recording (or the espeak-ng stand-in)."""
    try:
        data = yaml.safe_load(read_text(path))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise VoiceError(f"{path}: unreadable YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise VoiceError(f"{path}: expected a mapping of preset fields")
    unknown = set(data) - KEYS
    if unknown:
        raise VoiceError(f"{path}: unknown field(s) {sorted(unknown)}; allowed: {sorted(KEYS)}")
    name = data.get("name", path.stem)
    if name != path.stem:
        raise VoiceError(f"{path}: field 'name' is {name!r} but must equal the file stem {path.stem!r}")
    try:
        check_voice_name(name)
    except VoiceError as exc:
        raise VoiceError(f"{path}: {exc}") from exc
    prompt_text = optional_text(data, "prompt_text", path, default="") or ""
    instruct = optional_text(data, "instruct", path, default=None) or None
    description = optional_text(data, "description", path, default="") or ""
    fallback = data.get("fallback")
    if fallback is not None and fallback not in FALLBACKS:
        raise VoiceError(f"{path}: field 'fallback' must be one of {list(FALLBACKS)} or null")
    wav_field = data.get("prompt_wav")
    wav: Path | None = None
    if wav_field is not None:
        if not isinstance(wav_field, str) or not wav_field:
            raise VoiceError(f"{path}: field 'prompt_wav' must be a file name")
        wav = (directory / wav_field).resolve()
        if not wav.is_file():
            if fallback != "espeak":
                raise VoiceError(f"{path}: field 'prompt_wav': {wav} not found")
            wav = espeak_prompt(name, prompt_text, path, wav, cache_dir, espeak_executable)
        try:
            if wav.stat().st_size > MAX_PROMPT_BYTES:
                raise VoiceError(
                    f"{path}: field 'prompt_wav': {wav} is larger than {MAX_PROMPT_BYTES} bytes"
                )
            decode_prompt_wav(wav.read_bytes(), source=f"{path}: field 'prompt_wav' ({wav})")
        except OSError as exc:
            raise VoiceError(f"{path}: field 'prompt_wav': cannot read {wav}: {exc}") from exc
    return VoicePreset(name, wav, prompt_text, instruct, description)

def read_text(path: Path) -> str:
    """A preset file's text, refused past MAX_PRESET_BYTES."""
    with path.open("rb") as handle:
        data = handle.read(MAX_PRESET_BYTES + 1)
    if len(data) > MAX_PRESET_BYTES:
        raise VoiceError(f"{path}: larger than {MAX_PRESET_BYTES} bytes; not a voice preset")
    return data.decode("utf-8")

def espeak_prompt(
    name: str, prompt_text: str, source: Path, missing: Path, cache_dir: Path, espeak_executable: str
) -> Path:
    """Speak ``prompt_text`` with espeak-ng into the cache folder: a robotic stand-in recording."""
    from tts_engine.backends.espeak import AUTO_VOICE, resolve_voice  # only when a fallback is needed

    if not prompt_text:
        raise VoiceError(
            f"{source}: prompt_wav {missing} is missing and there is no prompt_text to speak"
        )
    executable = shutil.which(espeak_executable)
    if executable is None:
        raise VoiceError(f"{source}: prompt_wav {missing} is missing and espeak-ng is not installed")
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(prompt_text.encode("utf-8")).hexdigest()[:16]
    target = cache_dir / f"{name}.espeak.{digest}.wav"
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
        atomic_write(target, done.stdout)
    log.warning(
        "voice %r: %s is missing; using a robotic espeak-ng recording of its prompt_text instead "
        "(run scripts/download_model.py to fetch the real prompt)",
        name,
        missing,
    )
    return target
