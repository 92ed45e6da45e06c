"""The exact audio cache (docs/service.md): ``AudioCache`` (audio_cache.py) over a memory tier (memory.py)
and an optional folder (disk.py), its key (entry.py, revisions.py) and its streams (streams.py)."""

from gateway.service.cache.audio_cache import AudioCache
from gateway.service.cache.entry import CachedAudio, normalise_text, speech_key
from gateway.service.cache.revisions import model_revision, prompt_hash, voice_revision
from gateway.service.cache.streams import RecordingStream, ReplayStream

__all__ = [
    "AudioCache", "CachedAudio", "RecordingStream", "ReplayStream", "model_revision", "normalise_text",
    "prompt_hash", "speech_key", "voice_revision",
]  # fmt: skip
