"""The cache's memory tier: least recently used entries dropped first, within a byte budget; pinned
entries (the fixed phrases) are never dropped by the budget."""

from __future__ import annotations

from collections import OrderedDict

from gateway.service.cache.entry import CachedAudio

__all__ = ["MemoryTier"]


class MemoryTier:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lru: OrderedDict[str, CachedAudio] = OrderedDict()
        self._pinned: dict[str, CachedAudio] = {}
        self.lru_bytes = 0
        self.evictions = 0

    @property
    def nbytes(self) -> int:
        return self.lru_bytes + sum(e.nbytes for e in self._pinned.values())

    def __len__(self) -> int:
        return len(self._lru) + len(self._pinned)

    def get(self, key: str) -> CachedAudio | None:
        entry = self._pinned.get(key)
        if entry is not None:
            return entry
        entry = self._lru.get(key)
        if entry is not None:
            self._lru.move_to_end(key)
        return entry

    def put(self, entry: CachedAudio) -> None:
        """Keeps ``entry`` (as the most recent), dropping the least recent ones past the budget."""
        if entry.key in self._pinned or entry.nbytes > self.budget_bytes:
            return
        old = self._lru.pop(entry.key, None)
        if old is not None:
            self.lru_bytes -= old.nbytes
        self._lru[entry.key] = entry
        self.lru_bytes += entry.nbytes
        while self.lru_bytes > self.budget_bytes and self._lru:
            _, dropped = self._lru.popitem(last=False)
            self.lru_bytes -= dropped.nbytes
            self.evictions += 1

    def pin(self, entry: CachedAudio) -> None:
        old = self._lru.pop(entry.key, None)
        if old is not None:
            self.lru_bytes -= old.nbytes
        self._pinned[entry.key] = entry

    def unpin(self, key: str) -> None:
        self._pinned.pop(key, None)

    def drop_voice(self, voice: str) -> int:
        """Drops the (unpinned) entries spoken in ``voice``; how many."""
        keys = [key for key, entry in self._lru.items() if entry.voice == voice]
        for key in keys:
            self.lru_bytes -= self._lru.pop(key).nbytes
        return len(keys)
