"""What the cache key says about the voice and the model: revisions that change when they do."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from tts_engine.interface import SpeechEngine

if TYPE_CHECKING:
    from gateway.voices.store import VoiceStore

__all__ = ["model_revision", "prompt_hash", "voice_revision"]

BUILTIN = "builtin"
_MODEL_FILES = ("cosyvoice3.yaml", "llm.pt", "llm.rl.pt", "flow.pt", "hift.pt")
_revisions: dict[tuple[str, str, str, str], str] = {}


def voice_revision(voices: VoiceStore | None, name: str) -> str:
    """A preset's revision: its prompt recording (file name, size, mtime), transcript and instruct; a new
    version of the voice (POST /v1/voices with overwrite, another gateway's change) has another one.
    Voices built into the backend are ``builtin``."""
    if voices is None or name not in voices:
        return BUILTIN
    preset = voices.get(name)
    wav = str(preset.prompt_wav or "")
    memo = (name, wav, preset.prompt_text, preset.instruct or "")
    revision = _revisions.get(memo)
    if revision is None:
        try:
            stat = Path(wav).stat() if wav else None
            stamp = f"{stat.st_size}:{stat.st_mtime_ns}" if stat else ""
        except OSError:
            stamp = "missing"
        revision = hashlib.sha256(json.dumps([*memo, stamp]).encode()).hexdigest()[:16]
        if len(_revisions) > 4096:
            _revisions.clear()
        _revisions[memo] = revision
    return revision


def model_revision(engine: SpeechEngine, model_dir: Path | None) -> str:
    """The engine as the key sees it: its backend, native rate, text normalisation, and the size and mtime
    of the model's files where there are any (a new checkpoint is a new revision)."""
    info = {name: getattr(engine.info, name) for name in ("backend", "sample_rate", "text_normalization")}
    files: list[str] = []
    if model_dir is not None and info.get("backend") == "cosyvoice":
        for name in _MODEL_FILES:
            try:
                stat = (model_dir / name).stat()
            except OSError:
                continue
            files.append(f"{name}:{stat.st_size}:{stat.st_mtime_ns}")
    described = json.dumps({"info": info, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def prompt_hash(prompt_wav: bytes, prompt_text: str) -> str:
    """A zero-shot voice's part of the key: its recording and transcript."""
    digest = hashlib.sha256(prompt_wav)
    digest.update(b"\0" + prompt_text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
