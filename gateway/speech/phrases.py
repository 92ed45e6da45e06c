"""Fixed phrases kept as audio, so that a device always hears why, even while no engine can speak; and the
door through which device turns read the audio cache.

The greeting (``session.greeting``), the apology (``llm.apology``), the tool filler (``llm.tool_filler``)
and the notice for speech without a recogniser (``asr.not_configured_reply``) are the same sentences again
and again, and the apology is needed exactly when the engine cannot speak (every worker restarting,
stalled or gone). ``Phrases`` makes each once when the engine is ready (``Services.start``, bounded in
time), or takes it from the audio cache's folder where an earlier run left it, and keeps it **pinned in
the audio cache** (gateway/service/cache): never evicted, shared with the API (a client asking for the
greeting in that voice and rate gets the same audio). Phrases keeps its own references too, so it needs
no cache (``cache.enabled: false``, tests) and the apology can never be evicted from under a device.

When the voice they are spoken in is replaced or deleted, the phrases are made again in the background,
and the old audio stays in use until the new is ready (a device still hears the apology meanwhile).

A ``Speaker`` (gateway/speech/speaker.py) plays ``stream(text, voice)`` instead of asking the engine
whenever it is not None: a fixed phrase in the voice it was stored in, or (``cache.devices``) any
sentence the cache holds in that voice at the device's rate; and ``any_voice(apology)`` when the engine
fails.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.service.cache import AudioCache, CachedAudio, ReplayStream, speech_key, voice_revision
from tts_engine.errors import UnknownVoice
from tts_engine.interface import SpeechEngine

if TYPE_CHECKING:
    from gateway.voices.store import VoiceStore

log = logging.getLogger(__name__)

CHUNK_S = 0.24  # stored audio is read in chunks of this length (four 60 ms frames)
PREPARE_TIMEOUT_S = 60.0  # the longest the engine gets to speak one phrase
START_WAIT_S = 30.0  # start-up waits this long for them; what is left goes on in the background


def StoredSpeech(pcm: np.ndarray, sample_rate: int) -> ReplayStream:  # noqa: N802 - the old class's name
    """Stored audio as a ``SpeechStream`` in chunks of CHUNK_S, as fast as it is read (the device's pacer
    paces it)."""
    return ReplayStream(pcm, sample_rate, chunk_samples=max(1, int(CHUNK_S * sample_rate)))


class Phrases:
    """The fixed phrases' audio in one voice at one rate; ``prepare()`` fills it from an engine."""

    def __init__(
        self,
        texts: Iterable[str],
        *,
        output_rate: int,
        voice: str | None = None,
        cache: AudioCache | None = None,
        voices: VoiceStore | None = None,
        read_cache: bool = True,
    ) -> None:
        self.texts = list(dict.fromkeys(t.strip() for t in texts if t and t.strip()))
        self.output_rate = output_rate
        self.wanted_voice = voice  # None: the engine's default voice
        self.voice: str | None = None  # the voice the stored audio is in
        self._revision: str | None = None
        self._cache = cache
        self._voices = voices
        self._read_cache = read_cache and cache is not None and cache.enabled
        self._audio: dict[str, CachedAudio] = {}  # text -> its audio in self.voice
        self._previous: dict[str, CachedAudio] = {}  # the last voice's, for any_voice() while one is missing
        self._stale: set[str] = set()  # kept from the voice's previous version: the new one failed
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
            "seconds": round(sum(a.seconds for a in self._audio.values()), 2),
        }

    def _key(self, text: str, voice: str, revision: str) -> str:
        if self._cache is not None:
            return self._cache.key(text, voice=voice, voice_revision=revision, speed=1.0, instruct=None,
                                   output_rate=self.output_rate)  # fmt: skip
        return speech_key(text, voice=voice, voice_revision=revision, speed=1.0, instruct=None,
                          output_rate=self.output_rate, model_revision="")  # fmt: skip

    async def prepare(self, engine: SpeechEngine, *, timeout_s: float = PREPARE_TIMEOUT_S) -> None:
        """Make every phrase not stored yet (all of them when the voice or its version changed), from the
        cache's folder where it has them, else from the engine; the new audio replaces the old only once
        it is made. A phrase the engine fails is logged and left for the next call. Never raises."""
        try:
            voice = engine.resolve_voice(self.wanted_voice)
        except UnknownVoice:  # the configured voice is not loaded: the engine's default (logged at start-up)
            voice = engine.resolve_voice(None)
        revision = voice_revision(self._voices, voice)
        same = voice == self.voice and revision == self._revision
        made = {t: e for t, e in self._audio.items() if t not in self._stale} if same else {}
        stale: set[str] = set()
        started = time.monotonic()
        for text in self.texts:
            if text in made:
                continue
            key = self._key(text, voice, revision)
            entry = await self._cache.lookup(key) if self._cache is not None and self._cache.enabled else None
            if entry is None:
                entry = await self._speak(engine, text, voice, key, timeout_s)
            if entry is not None:
                made[text] = entry
            elif voice == self.voice and text in self._audio:  # the new one failed: the old plays on,
                made[text] = self._audio[text]  # and the next prepare() tries again
                stale.add(text)
        old = self._audio
        if not same:
            self._previous = {**self._previous, **old}
        self._audio, self.voice, self._revision, self._stale = made, voice, revision, stale
        if self._cache is not None:
            for entry in made.values():
                self._cache.pin(entry)
            for entry in old.values():
                if entry.key not in {e.key for e in made.values()}:
                    self._cache.unpin(entry.key)
        self.prepared_in_s = time.monotonic() - started
        if self._audio:
            log.info("%d fixed phrase(s) stored in voice %r (%.1f s of audio, %.2f s to make)",
                     len(self._audio), voice, self.status()["seconds"], self.prepared_in_s)  # fmt: skip

    async def _speak(
        self, engine: SpeechEngine, text: str, voice: str, key: str, timeout_s: float
    ) -> CachedAudio | None:
        try:
            async with asyncio.timeout(timeout_s):
                stream = engine.synthesize(text, voice=voice, output_rate=self.output_rate)
                try:
                    chunks = [np.asarray(chunk, dtype=np.int16) async for chunk in stream]
                finally:
                    await stream.aclose()
        except Exception as exc:  # noqa: BLE001 - an engine error, a timeout: the phrase stays missing
            log.warning("fixed phrase %r not stored (%s: %s)", text[:40], type(exc).__name__, exc)
            return None
        return CachedAudio.of(key, voice, self.output_rate, chunks) if chunks else None

    async def start(self, engine: SpeechEngine, *, wait_s: float = START_WAIT_S) -> None:
        """``prepare()`` at start-up: wait for it at most ``wait_s`` (a slow CPU model goes on in the
        background instead of holding the gateway's start)."""
        task = self._refresh = asyncio.create_task(self.prepare(engine), name="fixed phrases")
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        if not done:
            log.warning("fixed phrases not ready after %.0f s; going on in the background", wait_s)

    def voice_changed(self, engine: SpeechEngine, name: str) -> None:
        """A voice was added, replaced or removed: when it is the phrases' voice (or the one they should be
        in), make them again in the background, one refresh at a time; the old audio stays until then."""
        if name not in (self.voice, self.wanted_voice) or (self._refresh is not None and not self._refresh.done()):
            return
        self._refresh = asyncio.create_task(self.prepare(engine), name="fixed phrases")

    def stream(self, text: str, voice: str | None) -> ReplayStream | None:
        """Stored audio of ``text`` spoken in ``voice`` (None: the phrases' voice), else None: a fixed
        phrase, or with ``cache.devices`` any sentence the cache holds in that voice at this rate."""
        wanted = self.voice if voice is None else voice
        text = text.strip()
        entry = self._audio.get(text) if wanted == self.voice else None
        if entry is None and self._read_cache and wanted is not None:
            assert self._cache is not None
            revision = self._revision if wanted == self.voice else voice_revision(self._voices, wanted)
            entry = self._cache.peek(self._key(text, wanted, revision or ""))
        return None if entry is None else StoredSpeech(entry.pcm, entry.sample_rate)

    def any_voice(self, text: str) -> ReplayStream | None:
        """The stored audio of ``text`` whatever voice it is in (the apology when nothing else can speak)."""
        entry = self._audio.get(text.strip()) or self._previous.get(text.strip())
        return None if entry is None else StoredSpeech(entry.pcm, entry.sample_rate)

    async def aclose(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
