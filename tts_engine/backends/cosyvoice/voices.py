"""A CosyVoice backend's voices: a preset's recording made into a speaker record once, cached on disk.

The prompt recording of a preset is turned into a ``SpeakerRecord`` (prompt speech tokens, flow mel,
x-vector: the ONNX frontend runs once) and kept in ``voice_cache_dir`` (safetensors, written atomically),
under a key that changes with the frontend files (``model_fingerprint``), so a request costs no I/O and a
restart no frontend run. A :class:`PreparedVoice` adds the flow prompt built from the record.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import torch

from cosyvoice.frontend.speaker import SpeakerError, SpeakerRecord
from cosyvoice.model import CosyVoice3, ModelFilesError
from cosyvoice.token2wav import SpeakerPrompt
from tts_engine.voices import PromptAudio, VoiceError, VoicePreset, decode_prompt_wav, preset_cache_path

__all__ = ["PreparedVoice", "model_fingerprint", "prepare_record", "preset_record"]

log = logging.getLogger(__name__)


class PreparedVoice:
    """A prepared voice: its speaker record and flow prompt, built once."""

    def __init__(self, model: CosyVoice3, record: SpeakerRecord, instruct: str | None) -> None:
        self.record = record
        self.instruct = instruct
        self.flow_prompt: SpeakerPrompt = model.speaker_prompt(record)


def model_fingerprint(model: CosyVoice3) -> str:
    """Identifies the files a prepared voice depends on (frontend ONNX models, tokenizer)."""
    files = model.config.files
    parts = []
    for path in (
        files.campplus,
        files.speech_tokenizer,
        files.blank_en / "vocab.json",
        files.blank_en / "merges.txt",
    ):
        parts.append(f"{path.name}:{path.stat().st_size if path.is_file() else -1}")
    return "cosyvoice3-speaker/1;" + ";".join(parts)


def prepare_record(model: CosyVoice3, audio: PromptAudio, transcript: str) -> SpeakerRecord:
    """A recording and its transcript through the model's frontend (VoiceError when it cannot be used)."""
    wave = torch.from_numpy(audio.samples)  # [N]
    try:
        return model.prepare_speaker(wave, audio.sample_rate, transcript)
    except (SpeakerError, ModelFilesError, ValueError) as exc:
        raise VoiceError(f"cannot prepare the prompt recording: {exc}") from exc


def preset_record(
    model: CosyVoice3, preset: VoicePreset, cache_dir: Path | None, fingerprint: str
) -> SpeakerRecord:
    """The speaker record of ``preset``: from the cache when it holds a good one, else prepared (and kept)."""
    if preset.prompt_wav is None or not preset.prompt_text.strip():
        raise VoiceError(f"voice {preset.name!r}: the cosyvoice backend needs prompt_wav and prompt_text")
    cache = None if cache_dir is None else preset_cache_path(preset, cache_dir, key=fingerprint)
    record = _load_cached(cache)
    if record is None:
        try:
            data = preset.prompt_wav.read_bytes()
        except OSError as exc:
            raise VoiceError(f"voice {preset.name!r}: cannot read {preset.prompt_wav}: {exc}") from exc
        audio = decode_prompt_wav(data, source=str(preset.prompt_wav))
        record = prepare_record(model, audio, preset.prompt_text)
        if cache is not None:
            _save_record(record, cache)
    return record


def _load_cached(path: Path | None) -> SpeakerRecord | None:
    if path is None or not path.is_file():
        return None
    try:
        return SpeakerRecord.load(path)
    except SpeakerError as exc:
        log.warning("ignoring a bad cached voice (%s); preparing it again", exc)
        return None


def _save_record(record: SpeakerRecord, path: Path) -> None:
    """Write a speaker record atomically (a crash never leaves half a cache file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        record.save(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
