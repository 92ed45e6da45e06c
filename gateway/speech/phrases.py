"""Fixed phrases kept as audio, so that a device always hears why, even while no engine can speak.

The apology (``llm.apology``), the tool filler (``llm.tool_filler``) and the notice for speech without
a recogniser (``asr.not_configured_reply``) are the same sentences again and again, and the apology is
needed exactly when the engine cannot speak (every worker restarting, stalled or gone). ``Phrases``
synthesises each once when the engine is ready (``Services.start``, bounded in time; again in the
background when the voice they are spoken in is replaced) and keeps them as int16 PCM at the downlink
rate. A ``Speaker`` (gateway/speech/speaker.py) plays a stored phrase instead of asking the engine whenever the
sentence is one of them in the voice it was stored in, and plays the stored apology (in any voice)
when the engine fails it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import numpy as np

from tts_engine.errors import UnknownVoice
from tts_engine.interface import SpeechEngine

log = logging.getLogger(__name__)

CHUNK_S = 0.24  # stored audio is read in chunks of this length (four 60 ms frames)
PREPARE_TIMEOUT_S = 60.0  # the longest the engine gets to speak one phrase
START_WAIT_S = 30.0  # start-up waits this long for them; what is left goes on in the background


class StoredSpeech:
    """Stored audio with the surface of a ``SynthesisStream`` that a ``Speaker`` uses: async iteration
    over int16 chunks, ``aclose()``, ``unread_seconds``, ``set_playback_ahead()`` (ignored)."""

    _ids = itertools.count(1)

    def __init__(self, pcm: np.ndarray, sample_rate: int) -> None:
        self.req_id = f"phrase-{next(self._ids)}"
        self.sample_rate = sample_rate
        self._pcm = pcm
        self._at = 0
        self._step = max(1, int(CHUNK_S * sample_rate))
        self.is_aborted = False

    @property
    def is_finished(self) -> bool:
        return self.is_aborted or self._at >= self._pcm.size

    @property
    def unread_seconds(self) -> float:
        return 0.0 if self.is_aborted else (self._pcm.size - self._at) / self.sample_rate

    def set_playback_ahead(self, seconds: float) -> None:
        """Nothing to schedule: the audio is here."""

    def __aiter__(self) -> StoredSpeech:
        return self

    async def __anext__(self) -> np.ndarray:
        if self.is_finished:
            raise StopAsyncIteration
        chunk = self._pcm[self._at : self._at + self._step]
        self._at += chunk.size
        return chunk

    async def aclose(self) -> None:
        self.is_aborted = True

    async def __aenter__(self) -> StoredSpeech:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class Phrases:
    """The fixed phrases' audio in one voice at one rate; ``prepare()`` fills it from an engine."""

    def __init__(self, texts: Iterable[str], *, output_rate: int, voice: str | None = None) -> None:
        self.texts = list(dict.fromkeys(t.strip() for t in texts if t and t.strip()))
        self.output_rate = output_rate
        self.wanted_voice = voice  # None: the engine's default voice
        self.voice: str | None = None  # the voice the stored audio is in
        self._audio: dict[str, np.ndarray] = {}
        self._refresh: asyncio.Task[None] | None = None
        self.prepared_in_s: float | None = None

    @property
    def missing(self) -> list[str]:
        return [text for text in self.texts if text not in self._audio]

    def status(self) -> dict[str, Any]:
        return {
            "voice": self.voice,
            "stored": len(self._audio),
            "missing": self.missing,
            "seconds": round(sum(a.size for a in self._audio.values()) / self.output_rate, 2),
        }

    async def prepare(self, engine: SpeechEngine, *, timeout_s: float = PREPARE_TIMEOUT_S) -> None:
        """Speak every phrase not stored yet (all of them when the voice changed) and keep the audio; a
        phrase the engine fails is logged and left for the next call. Never raises."""
        try:
            voice = engine.resolve_voice(self.wanted_voice)
        except UnknownVoice:  # the configured voice is not loaded: the engine's default (logged at start-up)
            voice = engine.resolve_voice(None)
        if voice != self.voice:
            self._audio.clear()
            self.voice = voice
        started = time.monotonic()
        for text in self.missing:
            try:
                async with asyncio.timeout(timeout_s):
                    stream = engine.synthesize(text, voice=voice, output_rate=self.output_rate)
                    try:
                        chunks = [np.asarray(chunk, dtype=np.int16) async for chunk in stream]
                    finally:
                        await stream.aclose()
            except Exception as exc:  # noqa: BLE001 - an engine error, a timeout: the phrase stays missing
                log.warning("fixed phrase %r not stored (%s: %s)", text[:40], type(exc).__name__, exc)
                continue
            if chunks:
                self._audio[text] = np.concatenate(chunks)
        self.prepared_in_s = time.monotonic() - started
        if self._audio:
            log.info("%d fixed phrase(s) stored in voice %r (%.1f s of audio, %.2f s to make)",
                     len(self._audio), voice, self.status()["seconds"], self.prepared_in_s)  # fmt: skip

    async def start(self, engine: SpeechEngine, *, wait_s: float = START_WAIT_S) -> None:
        """``prepare()`` at start-up: wait for it at most ``wait_s`` (a slow CPU model goes on in the
        background instead of holding the gateway's start)."""
        task = self._refresh = asyncio.create_task(self.prepare(engine), name="fixed phrases")
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        if not done:
            log.warning("fixed phrases not ready after %.0f s; going on in the background", wait_s)

    def voice_changed(self, engine: SpeechEngine, name: str) -> None:
        """A voice was added, replaced or removed: when it is the phrases' voice, make them again (in the
        background, one refresh at a time)."""
        if name != self.voice or (self._refresh is not None and not self._refresh.done()):
            return
        self._audio.clear()
        self.voice = None
        self._refresh = asyncio.create_task(self.prepare(engine), name="fixed phrases")

    def stream(self, text: str, voice: str | None) -> StoredSpeech | None:
        """The stored audio of ``text`` spoken in ``voice`` (None: the default voice), else None."""
        audio = self._audio.get(text.strip())
        if audio is None or (voice is not None and voice != self.voice):
            return None
        return StoredSpeech(audio, self.output_rate)

    def any_voice(self, text: str) -> StoredSpeech | None:
        """The stored audio of ``text`` whatever voice it is in (the apology when nothing else can speak)."""
        audio = self._audio.get(text.strip())
        return None if audio is None else StoredSpeech(audio, self.output_rate)

    async def aclose(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
