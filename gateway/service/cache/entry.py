"""One cached answer: int16 PCM at its output rate, cut into the chunks the engine produced, and its key."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass

import numpy as np

__all__ = ["CachedAudio", "normalise_text", "speech_key"]


@dataclass(frozen=True, slots=True, eq=False)
class CachedAudio:
    key: str
    voice: str  # "" for a zero-shot voice
    sample_rate: int
    pcm: np.ndarray  # int16 mono, read-only
    chunks: tuple[int, ...]  # sizes of the chunks as the engine produced them (sum: pcm.size)

    @property
    def nbytes(self) -> int:
        return int(self.pcm.nbytes)

    @property
    def seconds(self) -> float:
        return self.pcm.size / self.sample_rate

    @classmethod
    def of(cls, key: str, voice: str, sample_rate: int, chunks: list[np.ndarray]) -> CachedAudio:
        pcm = np.concatenate(chunks).astype(np.int16, copy=False) if chunks else np.zeros(0, np.int16)
        pcm = np.ascontiguousarray(pcm)
        pcm.flags.writeable = False
        return cls(key, voice, sample_rate, pcm, tuple(int(c.size) for c in chunks if c.size))


def normalise_text(text: str) -> str:
    """What makes two texts the same request: NFC, whitespace runs as one space, no edge whitespace."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def speech_key(
    text: str,
    *,
    voice: str,
    voice_revision: str,
    speed: float,
    instruct: str | None,
    output_rate: int,
    model_revision: str,
    prompt_hash: str = "",
) -> str:
    """The key of an exact request: the normalised text, the voice and its revision, speed, instruct, the
    output rate, the model's revision and, for a zero-shot voice, its prompt's hash. The output format is
    not part of it: the cache keeps PCM, and each format is encoded from it (the same bytes every time)."""
    parts = {
        "t": normalise_text(text), "v": voice, "vr": voice_revision, "s": round(float(speed), 4),
        "i": normalise_text(instruct or ""), "r": int(output_rate), "m": model_revision, "p": prompt_hash,
    }  # fmt: skip
    canonical = json.dumps(parts, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
