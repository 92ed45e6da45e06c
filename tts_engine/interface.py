"""The engine interface: what device sessions, the HTTP/WS API and tools use, whoever serves it.

Two classes implement ``SpeechEngine``: ``TTSEngine`` (tts_engine/engine.py, the engine as a thread of
this process) and ``EngineClient`` (gateway/engine_client/client.py, engines in worker processes). The gateway
depends on this Protocol, never on either class. ``synthesize()`` returns a ``SpeechStream``: a
``SynthesisStream`` (tts_engine/request.py) or its remote subclass; a device's stored fixed phrases
(gateway/speech/phrases.py) have the same surface.

Rates, one name per meaning: ``SpeechEngine.sample_rate`` is the backend's native rate (what it
synthesises at); ``synthesize(output_rate=)`` is the rate the caller wants its stream in (the engine
resamples); ``SpeechStream.sample_rate`` is the rate of that stream's samples (its request's output
rate). ``OUTPUT_RATES`` is the one list of output rates the engine serves.

Priority classes (``synthesize(priority=)``, ``PRIORITIES``): ``"device"`` (a device's live turn: the
gateway's speaker), ``"interactive"`` (the default: an API client waiting on its stream) and ``"batch"``
(work nobody listens to live). The engine's scheduler admits and ranks by class first, then by playback
slack; a batch request only takes capacity the others leave free, yields its hops to a listener waiting
for first audio, and is parked (its state kept) when a higher class needs its KV slot (docs/engine-workers.md).

``EngineInfo`` is what an engine is (backend, native rate, cloning, text normalisation, its limits):
built once by ``TTSEngine`` from its backend, sent in a worker's ``hello``, and read back by the
``EngineClient``; both engines' ``health()`` start from it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from tts_engine.voices import VoicePreset

OUTPUT_RATES: tuple[int, ...] = (8000, 12000, 16000, 22050, 24000, 44100, 48000)
"""Every rate ``synthesize(output_rate=)`` takes (the API's ``sample_rate`` and the device downlink's
``audio.output_sample_rate`` are checked against this list or a subset of it)."""


Priority = Literal["device", "interactive", "batch"]
PRIORITIES: tuple[Priority, ...] = ("device", "interactive", "batch")
"""The engine's priority classes, highest first (``synthesize(priority=)``)."""
DEFAULT_PRIORITY: Priority = "interactive"


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInfo:
    """What an engine is and what it takes; fixed for its lifetime (voices change: they are not here)."""

    backend: str
    sample_rate: int  # the backend's native rate
    supports_cloning: bool = False
    text_normalization: str = "off"  # the normaliser's mode (wetext, basic, off)
    max_text_chars: int | None = None  # the longest text the backend takes (None: no limit)
    max_buffered_chunks: int = 8  # unread chunks a stream may hold before the engine waits for its reader
    max_pending_requests: int = 256  # live + queued requests before synthesize() refuses

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class SpeechStream(Protocol):
    """One request's audio: an async iterator of int16 mono chunks at ``sample_rate``.

    ``aclose()`` (or leaving ``async with``) aborts it; ``set_playback_ahead()`` tells the engine how much
    of the same listener's audio plays before its first sample (its slack); ``unread_seconds`` is the
    audio made for it and not read yet.
    """

    req_id: str
    sample_rate: int
    is_aborted: bool

    @property
    def is_finished(self) -> bool: ...

    @property
    def unread_seconds(self) -> float: ...

    def set_playback_ahead(self, seconds: float) -> None: ...

    def __aiter__(self) -> AsyncIterator[np.ndarray]: ...

    async def __anext__(self) -> np.ndarray: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> SpeechStream: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class SpeechEngine(Protocol):
    """The shared speech engine as the gateway uses it (see the module docstring)."""

    @property
    def info(self) -> EngineInfo: ...

    @property
    def backend_name(self) -> str: ...

    @property
    def sample_rate(self) -> int:
        """The backend's native rate."""
        ...

    @property
    def supports_cloning(self) -> bool: ...

    @property
    def text_normalization(self) -> str: ...

    @property
    def max_text_chars(self) -> int | None: ...

    @property
    def max_pending_requests(self) -> int: ...

    @property
    def voices(self) -> list[str]: ...

    @property
    def default_voice(self) -> str: ...

    @property
    def is_running(self) -> bool: ...

    @property
    def stats(self) -> dict[str, int | float]: ...

    def health(self) -> dict[str, Any]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def synthesize(
        self,
        text: str,
        *,
        voice: str | None = None,
        output_rate: int = 16000,
        req_id: str | None = None,
        speed: float = 1.0,
        instruct: str | None = None,
        playback_ahead: float = 0.0,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> SpeechStream:
        """Queue ``text`` in ``voice`` (None: the default); returns its stream at once. ``priority``: one
        of ``PRIORITIES`` (ValueError otherwise)."""
        ...

    def synthesize_zero_shot(
        self,
        text: str,
        *,
        prompt_wav: bytes,
        prompt_text: str,
        output_rate: int = 16000,
        speed: float = 1.0,
        req_id: str | None = None,
        instruct: str | None = None,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> SpeechStream:
        """Like ``synthesize()`` in a voice cloned from ``prompt_wav`` for this request only."""
        ...

    def resolve_voice(self, voice: str | None) -> str:
        """``voice`` as the engine would speak it: the default for None; ``UnknownVoice`` if not offered."""
        ...

    def abort(self, req_id: str) -> bool: ...

    async def add_voice(self, preset: VoicePreset) -> None: ...

    async def remove_voice(self, name: str) -> None: ...
