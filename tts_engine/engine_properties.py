"""What an engine is, read from its ``EngineInfo``: the read-only side that the engine in this process
(``TTSEngine``, tts_engine/engine.py) and the engine over worker processes (``EngineClient``,
gateway/engine_client/client.py) share, with the voice list both keep and refresh after voice calls.

A class using ``EngineProperties`` defines ``info`` and keeps ``_voices``, ``_default_voice`` and its
open streams by id (``_streams``); everything else here is read from those.
"""

from __future__ import annotations

from collections.abc import Mapping

from tts_engine.arguments import resolve_voice
from tts_engine.interface import EngineInfo
from tts_engine.request import SynthesisStream
from tts_engine.voices import VoiceError


class EngineProperties:
    """The read-only properties of a ``SpeechEngine`` (tts_engine/interface.py), from ``info``."""

    _voices: list[str]
    _default_voice: str
    _streams: Mapping[str, SynthesisStream]  # open streams by req_id

    @property
    def info(self) -> EngineInfo:
        raise NotImplementedError

    @property
    def backend_name(self) -> str:
        return self.info.backend

    @property
    def sample_rate(self) -> int:
        """The backend's native rate (streams are resampled to the output rate each request asks for)."""
        return self.info.sample_rate

    @property
    def supports_cloning(self) -> bool:
        """``add_voice()`` and ``synthesize_zero_shot()`` work with this backend."""
        return self.info.supports_cloning

    @property
    def text_normalization(self) -> str:
        """The normaliser's mode (wetext, basic, off)."""
        return self.info.text_normalization

    @property
    def max_text_chars(self) -> int | None:
        """The backend's text limit; None: no limit."""
        return self.info.max_text_chars

    @property
    def voices(self) -> list[str]:
        return list(self._voices)

    @property
    def default_voice(self) -> str:
        return self._default_voice

    def resolve_voice(self, voice: str | None) -> str:
        """``voice`` as it would be spoken: the default for None; ``UnknownVoice`` if not offered."""
        return resolve_voice(voice, self._default_voice, self._voices)

    def abort(self, req_id: str) -> bool:
        """Abort an open request; its stream ends quietly. False when no open stream has this id."""
        stream = self._streams.get(req_id)
        return stream is not None and stream.abort()

    def _check_cloning(self) -> None:
        """VoiceError unless this backend can clone (``add_voice()``, ``remove_voice()``)."""
        if not self.supports_cloning:
            raise VoiceError(f"backend {self.backend_name} cannot clone voices")
