"""The `cache` section: the exact audio cache (gateway/service/cache, docs/service.md)."""

from __future__ import annotations

from pydantic import Field

from gateway.config.base import Section


class CacheConfig(Section):
    """Identical speech requests served from stored audio: memory (LRU) and, optionally, a folder."""

    enabled: bool = True
    # Audio kept in memory (int16 PCM), least recently used dropped first; the fixed phrases are pinned.
    memory_bytes: int = Field(256 * 1024 * 1024, ge=0, le=1 << 40)
    # A folder for a second, larger tier that survives restarts ("" = memory only; relative to the
    # project root). Entries are written whole and checked when read: a torn one is never served.
    dir: str = ""
    disk_bytes: int = Field(2 * 1024 * 1024 * 1024, ge=0, le=1 << 44)
    # Longest audio kept per entry (longer answers are served, not stored).
    max_entry_seconds: float = Field(300.0, gt=0, le=3600)
    # A hit is streamed like a fresh answer: the first replay_lead_s of audio at once, the rest no faster
    # than replay_speed x real time (0 = as fast as the client reads).
    replay_lead_s: float = Field(1.0, ge=0, le=60)
    replay_speed: float = Field(4.0, ge=0, le=1000)
    # Device turns read the cache too (any sentence already stored in the device's voice and rate).
    devices: bool = True
    # Part of every key: change it to drop every entry. "" = derived from the engine (backend, rate,
    # text normalisation, the model's files).
    model_revision: str = ""
