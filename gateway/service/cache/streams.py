"""Streams of the cache, with the ``SpeechStream`` surface (tts_engine/interface.py) every caller reads.

``ReplayStream``: a cached answer played back chunk by chunk as the engine produced it. Paced for HTTP
clients like a fresh answer (the first ``lead_s`` of audio at once, the rest no faster than ``speed`` x
real time: a hit's first byte takes milliseconds, and it does not arrive as one burst a fresh answer
never is); unpaced for device turns, whose own pacer sends frames in real time.

``RecordingStream``: an engine stream passed through unchanged while its chunks are kept; when it ends
normally the whole answer is handed to ``on_complete`` (the cache). An answer that is aborted, fails or
grows past ``max_samples`` is not kept.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from types import TracebackType

import numpy as np

from gateway.service.cache.entry import CachedAudio
from tts_engine.interface import SpeechStream

__all__ = ["PassThroughStream", "RecordingStream", "ReplayStream"]

_ids = itertools.count(1)


class ReplayStream:
    """Stored audio as a ``SpeechStream`` (module docstring); ``chunk_samples`` re-cuts it evenly."""

    def __init__(
        self,
        pcm: np.ndarray,
        sample_rate: int,
        *,
        chunks: tuple[int, ...] | None = None,
        chunk_samples: int | None = None,
        lead_s: float | None = None,
        speed: float = 0.0,
        req_id: str | None = None,
    ) -> None:
        self.req_id = req_id or f"cached-{next(_ids)}"
        self.sample_rate = sample_rate
        self.is_aborted = False
        self._pcm = pcm
        if chunk_samples is not None or not chunks:
            step = max(1, chunk_samples or pcm.size or 1)
            chunks = tuple(min(step, pcm.size - at) for at in range(0, pcm.size, step))
        self._chunks = chunks
        self._index = 0
        self._at = 0
        self._paced = lead_s is not None and speed > 0
        self._lead = lead_s or 0.0
        self._speed = speed
        self._started: float | None = None

    @classmethod
    def of(cls, entry: CachedAudio, **kw: object) -> ReplayStream:
        return cls(entry.pcm, entry.sample_rate, chunks=entry.chunks, **kw)  # type: ignore[arg-type]

    @property
    def is_finished(self) -> bool:
        return self.is_aborted or self._index >= len(self._chunks)

    @property
    def unread_seconds(self) -> float:
        return 0.0 if self.is_aborted else (self._pcm.size - self._at) / self.sample_rate

    def set_playback_ahead(self, seconds: float) -> None:
        """Nothing to schedule: the audio is here."""

    def __aiter__(self) -> ReplayStream:
        return self

    async def __anext__(self) -> np.ndarray:
        if self.is_finished:
            raise StopAsyncIteration
        if self._paced:
            now = time.monotonic()
            if self._started is None:
                self._started = now
            due = self._started + max(0.0, self._at / self.sample_rate - self._lead) / self._speed
            if due > now:
                await asyncio.sleep(due - now)
            if self.is_aborted:
                raise StopAsyncIteration
        size = self._chunks[self._index]
        chunk = self._pcm[self._at : self._at + size]
        self._index += 1
        self._at += size
        return chunk

    async def aclose(self) -> None:
        self.is_aborted = True

    async def __aenter__(self) -> ReplayStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class PassThroughStream:
    """An engine stream with the ``SpeechStream`` surface, passed through; subclasses watch ``__anext__``."""

    def __init__(self, inner: SpeechStream) -> None:
        self.inner = inner
        self.req_id = inner.req_id
        self.sample_rate = inner.sample_rate

    @property
    def is_aborted(self) -> bool:
        return self.inner.is_aborted

    @is_aborted.setter
    def is_aborted(self, value: bool) -> None:
        self.inner.is_aborted = value

    @property
    def is_finished(self) -> bool:
        return self.inner.is_finished

    @property
    def unread_seconds(self) -> float:
        return self.inner.unread_seconds

    def set_playback_ahead(self, seconds: float) -> None:
        self.inner.set_playback_ahead(seconds)

    def __aiter__(self) -> PassThroughStream:
        return self

    async def __anext__(self) -> np.ndarray:
        return await self.inner.__anext__()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> PassThroughStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class RecordingStream(PassThroughStream):
    """An engine stream whose complete answer is handed to ``on_complete`` (module docstring)."""

    def __init__(
        self,
        inner: SpeechStream,
        *,
        key: str,
        voice: str,
        max_samples: int,
        on_complete: Callable[[CachedAudio], None],
    ) -> None:
        super().__init__(inner)
        self._key = key
        self._voice = voice
        self._max_samples = max_samples
        self._on_complete = on_complete
        self._chunks: list[np.ndarray] | None = []
        self._samples = 0

    async def __anext__(self) -> np.ndarray:
        try:
            chunk = await self.inner.__anext__()
        except StopAsyncIteration:
            chunks, self._chunks = self._chunks, None
            if chunks is not None and not self.inner.is_aborted and self._samples:
                self._on_complete(CachedAudio.of(self._key, self._voice, self.sample_rate, chunks))
            raise
        except BaseException:
            self._chunks = None  # failed or cancelled: nothing of it is kept
            raise
        if self._chunks is not None:
            self._samples += chunk.size
            if self._samples > self._max_samples:
                self._chunks = None
            elif chunk.size:
                self._chunks.append(np.array(chunk, dtype=np.int16, copy=True))
        return chunk

    async def aclose(self) -> None:
        self._chunks = None  # a complete answer was handed over when it ended
        await self.inner.aclose()
