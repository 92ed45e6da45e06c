"""``AudioCache``: identical speech requests served from stored audio (docs/service.md, "The audio cache").

The key (entry.py) is the normalised text, the voice and its revision, speed, instruct, the output rate,
the model's revision and, for a zero-shot voice, its prompt's hash. The first answer is kept as it is
produced (``recording()``: a ``RecordingStream`` around the engine's stream); a repeat is a
``ReplayStream`` of it (``replay()``). Two tiers: memory (LRU within ``cache.memory_bytes``) and, with
``cache.dir``, a folder (disk.py: bounded, crash-safe) written in the background by one task through a
bounded queue (when it is full the disk copy is skipped; memory still has the entry). A disk hit is read
in a thread and moves into memory.

The fixed phrases (gateway/speech/phrases.py) live here too, pinned: never evicted, so devices and the
API share them. ``invalidate_voice()`` drops a replaced or deleted voice's entries (pinned ones are
replaced by their owner once the new ones are ready); an answer recorded while that happened is not kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from gateway.config import CacheConfig
from gateway.service.cache.disk import DiskTier
from gateway.service.cache.entry import CachedAudio, speech_key
from gateway.service.cache.memory import MemoryTier
from gateway.service.cache.revisions import model_revision
from gateway.service.cache.streams import RecordingStream, ReplayStream
from tts_engine.interface import SpeechEngine, SpeechStream

__all__ = ["AudioCache"]

log = logging.getLogger(__name__)

DISK_QUEUE = 64  # entries waiting for the disk writer
CLOSE_WAIT_S = 5.0  # the longest shutdown waits for queued disk writes


class AudioCache:
    def __init__(self, cfg: CacheConfig, *, root: Path | None = None) -> None:
        self.cfg = cfg
        self.enabled = cfg.enabled
        self.memory = MemoryTier(cfg.memory_bytes if cfg.enabled else 0)
        self.disk: DiskTier | None = None
        if cfg.enabled and cfg.dir:
            folder = Path(cfg.dir)
            self.disk = DiskTier(folder if folder.is_absolute() else (root or Path.cwd()) / folder, cfg.disk_bytes)
        self.model_revision = cfg.model_revision
        self.hits = {"memory": 0, "disk": 0}
        self.misses = 0
        self.skipped = 0  # answers too long to keep
        self._queue: asyncio.Queue[CachedAudio] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._generation: dict[str, int] = {}  # voice -> invalidations so far

    async def start(self, engine: SpeechEngine, model_dir: Path | None = None) -> None:
        """After the engine started: the model revision (unless configured), the disk tier's index."""
        if not self.model_revision:
            self.model_revision = model_revision(engine, model_dir)
        if self.disk is not None and self._writer is None:
            try:
                await asyncio.to_thread(self.disk.scan)
            except OSError as exc:
                log.error("!!! audio cache folder %s is not usable (%s): memory only", self.disk.dir, exc)
                self.disk = None
                return
            self._queue = asyncio.Queue(DISK_QUEUE)
            self._writer = asyncio.create_task(self._write_to_disk(), name="audio cache writer")
            log.info("audio cache: %d entries (%.1f MB) in %s", len(self.disk), self.disk.nbytes / 1e6, self.disk.dir)

    async def aclose(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        queue = self._queue
        if queue is not None and not queue.empty():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await queue.join()
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)

    # ---- keys and lookups ------------------------------------------------------------

    def key(self, text: str, *, voice: str, voice_revision: str, speed: float, instruct: str | None,
            output_rate: int, prompt_hash: str = "") -> str:  # fmt: skip
        return speech_key(text, voice=voice, voice_revision=voice_revision, speed=speed, instruct=instruct,
                          output_rate=output_rate, model_revision=self.model_revision, prompt_hash=prompt_hash)  # fmt: skip

    def peek(self, key: str) -> CachedAudio | None:
        """The memory tier only, without waiting (device turns); counts a hit, not a miss."""
        entry = self.memory.get(key) if self.enabled else None
        if entry is not None:
            self.hits["memory"] += 1
        return entry

    async def lookup(self, key: str) -> CachedAudio | None:
        """Memory, then disk (read in a thread and kept in memory); counts a hit or a miss."""
        if not self.enabled:
            return None
        entry = self.memory.get(key)
        if entry is not None:
            self.hits["memory"] += 1
            return entry
        if self.disk is not None and key in self.disk:
            entry = await asyncio.to_thread(self.disk.read, key)
            if entry is not None:
                self.hits["disk"] += 1
                self.memory.put(entry)
                return entry
        self.misses += 1
        return None

    # ---- storing ---------------------------------------------------------------------

    def recording(self, stream: SpeechStream, *, key: str, voice: str) -> SpeechStream:
        """``stream`` as it is, its complete answer kept under ``key``."""
        if not self.enabled:
            return stream
        generation = self._generation.get(voice, 0)
        max_samples = int(self.cfg.max_entry_seconds * stream.sample_rate)

        def complete(entry: CachedAudio) -> None:
            if self._generation.get(voice, 0) == generation:  # the voice was not replaced meanwhile
                self.store(entry)

        return RecordingStream(stream, key=key, voice=voice, max_samples=max_samples, on_complete=complete)

    def store(self, entry: CachedAudio) -> None:
        if not self.enabled:
            return
        if entry.seconds > self.cfg.max_entry_seconds:
            self.skipped += 1
            return
        self.memory.put(entry)
        self._to_disk(entry)

    def pin(self, entry: CachedAudio) -> None:
        """Keeps ``entry`` whatever the budget (the fixed phrases), in memory and on disk."""
        self.memory.pin(entry)
        self._to_disk(entry)

    def unpin(self, key: str) -> None:
        self.memory.unpin(key)

    def _to_disk(self, entry: CachedAudio) -> None:
        if self.disk is None or self._queue is None or entry.key in self.disk:
            return
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            log.debug("audio cache: disk writer busy; %s kept in memory only", entry.key[:12])

    async def _write_to_disk(self) -> None:
        assert self._queue is not None and self.disk is not None
        while True:
            entry = await self._queue.get()
            try:
                await asyncio.to_thread(self.disk.write, entry)
            finally:
                self._queue.task_done()

    def replay(self, entry: CachedAudio, *, paced: bool = True) -> ReplayStream:
        if paced:
            return ReplayStream.of(entry, lead_s=self.cfg.replay_lead_s, speed=self.cfg.replay_speed)
        return ReplayStream.of(entry)

    async def invalidate_voice(self, voice: str) -> None:
        """``voice`` was replaced or deleted: its entries go (pinned ones stay until their owner replaces
        them), and answers in it still being recorded are not kept."""
        self._generation[voice] = self._generation.get(voice, 0) + 1
        dropped = self.memory.drop_voice(voice)
        if self.disk is not None:
            dropped += await asyncio.to_thread(self.disk.drop_voice, voice)
        if dropped:
            log.info("audio cache: %d entries of voice %r dropped (voice changed)", dropped, voice)

    def stats(self) -> dict[str, Any]:
        disk = self.disk
        return {
            "enabled": self.enabled,
            "hits_memory": self.hits["memory"],
            "hits_disk": self.hits["disk"],
            "misses": self.misses,
            "entries_memory": len(self.memory),
            "bytes_memory": self.memory.nbytes,
            "evictions_memory": self.memory.evictions,
            "entries_disk": len(disk) if disk else 0,
            "bytes_disk": disk.nbytes if disk else 0,
            "evictions_disk": disk.evictions if disk else 0,
            "damaged_disk": disk.torn if disk else 0,
            "skipped": self.skipped,
        }
