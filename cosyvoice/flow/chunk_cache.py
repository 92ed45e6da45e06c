"""Exact reuse of the flow's complete chunks: per-voice prompt prefixes and per-stream chunk caches.

In a streaming hop the DiT attends block-causally in chunks of ``static_chunk_size`` frames counted from
frame 0, the CFM noise is position-locked and a frame's conditioning (mu) depends on its token and the
``pre_lookahead_len`` tokens after it. So once a chunk's tokens and their look-ahead tokens are known,
the whole Euler trajectory of that chunk is fixed, and what any later frame reads from it is too:

* the attention keys and values of its frames, for every (Euler step, block, CFG row);
* the left context of the causal conv position embedding: the last ``conv_kernel - 1`` frames of the
  input projection (conv1's input) and of conv1's output after Mish (conv2's input), per (step, CFG row).

A :class:`ChunkSegment` holds that state for a run of complete chunks; a :class:`FlowRowCache` is a
contiguous run of segments from frame 0 (a voice's prompt prefix, shared, then the stream's own ones).
The solver (cosyvoice/flow/incremental.py) computes only the frames after the cached prefix and can
capture the new complete chunks as new segments. Results equal a full recompute up to floating point
rounding (measured: tests/test_flow_cache.py).

:class:`FlowCacheManager` charges every segment to one byte budget: voice prefixes live in an LRU
registry keyed by the voice's prompt object (a new or overwritten voice is a new object, so a stale
prefix is never served) and are evicted when streams need room; a stream that finds no room simply
keeps what it has and recomputes the rest on its next hop.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "CacheKey",
    "ChunkSegment",
    "FlowCacheManager",
    "FlowRowCache",
    "segment_bytes",
]


@dataclass(frozen=True, slots=True)
class CacheKey:
    """What cached numbers depend on besides a row's inputs: the estimator and the solver settings."""

    estimator: int  # id() of the DiT (its weights are fixed while it serves)
    n_timesteps: int
    cfg_rate: float
    temperature: float
    dtype: torch.dtype
    device: torch.device


@dataclass(eq=False, slots=True)
class ChunkSegment:
    """State of frames ``start .. start + frames - 1`` (whole chunks) read by later frames."""

    start: int
    k: Tensor  # [S, depth, C, H, n, Dh] attention keys (rotary applied), C = CFG copies
    v: Tensor  # [S, depth, C, H, n, Dh] attention values
    conv_in: Tensor  # [S, C, W, D] input projection, the W frames ending at this segment's end
    conv_mid: Tensor  # [S, C, W, D] conv1 output after Mish, the W frames ending at this segment's end

    @property
    def frames(self) -> int:
        return int(self.k.shape[4])

    @property
    def end(self) -> int:
        return self.start + self.frames

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.conv_in, self.conv_mid))


def segment_bytes(dit_cfg: Any, frames: int, *, n_timesteps: int, copies: int, element_size: int) -> int:
    """Bytes of a segment of ``frames`` frames (keys and values plus the two conv tails)."""
    kv = 2 * n_timesteps * dit_cfg.depth * copies * frames * dit_cfg.heads * dit_cfg.dim_head
    tails = 2 * n_timesteps * copies * (dit_cfg.conv_kernel - 1) * dit_cfg.dim
    return (kv + tails) * element_size


class _VoiceEntry:
    __slots__ = ("owner", "key", "refs", "segments", "nbytes", "registered")

    def __init__(self, owner: object, key: CacheKey, segments: list[ChunkSegment]) -> None:
        self.owner = owner  # keeps id(owner) unique while the entry lives
        self.key = key
        self.segments = segments
        self.nbytes = sum(s.nbytes for s in segments)
        self.refs = 0  # stream caches built on it
        self.registered = True


class FlowCacheManager:
    """One byte budget for every voice prefix and stream cache of a flow; not thread-safe (one engine thread)."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {limit_bytes}")
        self.limit_bytes = int(limit_bytes)
        self.voice_bytes = 0  # charged for voice prefixes (registered, or still used by a stream)
        self.stream_bytes = 0  # charged for stream segments
        self._voices: OrderedDict[int, _VoiceEntry] = OrderedDict()  # LRU first
        self.counts = dict.fromkeys(("voice_hits", "voice_misses", "voice_evictions", "stream_refusals"), 0)

    @property
    def used_bytes(self) -> int:
        return self.voice_bytes + self.stream_bytes

    def stats(self) -> dict[str, int]:
        return {
            "flow_cache_limit_bytes": self.limit_bytes,
            "flow_cache_bytes": self.used_bytes,
            "flow_cache_voice_bytes": self.voice_bytes,
            "flow_cache_stream_bytes": self.stream_bytes,
            "flow_cache_voices": len(self._voices),
            **{f"flow_cache_{k}": v for k, v in self.counts.items()},
        }

    # -- voices --------------------------------------------------------------------------------

    def stream_cache(self, voice: object | None) -> FlowRowCache:
        """A new stream's cache; its first call starts from ``voice``'s prefix if one is registered then.

        ``voice`` is the object that identifies the prompt (the token2wav ``SpeakerPrompt``); None for a
        one-off prompt whose prefix is never shared.
        """
        return FlowRowCache(self, voice)

    def _attach(self, voice: object, key: CacheKey) -> _VoiceEntry | None:
        entry = self._voices.get(id(voice))
        if entry is None or entry.owner is not voice or entry.key != key:
            self.counts["voice_misses"] += 1
            return None
        self._voices.move_to_end(id(voice))
        entry.refs += 1
        self.counts["voice_hits"] += 1
        return entry

    def has_voice(self, voice: object) -> bool:
        entry = self._voices.get(id(voice))
        return entry is not None and entry.owner is voice

    def offer_voice(self, voice: object, key: CacheKey, segments: list[ChunkSegment]) -> _VoiceEntry | None:
        """Register ``segments`` (from frame 0) as ``voice``'s prefix if it has none and they fit."""
        if self.has_voice(voice) or not segments:
            return None
        nbytes = sum(s.nbytes for s in segments)
        if not self._make_room(nbytes):
            return None
        entry = _VoiceEntry(voice, key, segments)
        self._voices[id(voice)] = entry
        self.voice_bytes += nbytes
        return entry

    def drop_voice(self, voice: object) -> bool:
        """Forget ``voice``'s prefix (voice deleted or overwritten); streams using it keep their copy."""
        entry = self._voices.get(id(voice))
        if entry is None or entry.owner is not voice:
            return False
        self._unregister(entry)
        return True

    def clear(self) -> None:
        for entry in list(self._voices.values()):
            self._unregister(entry)

    def _unregister(self, entry: _VoiceEntry) -> None:
        del self._voices[id(entry.owner)]
        entry.registered = False
        if entry.refs == 0:
            self.voice_bytes -= entry.nbytes

    def _release_voice_ref(self, entry: _VoiceEntry) -> None:
        entry.refs -= 1
        if entry.refs == 0 and not entry.registered:
            self.voice_bytes -= entry.nbytes

    def _make_room(self, nbytes: int) -> bool:
        """Evict least recently used voice prefixes until ``nbytes`` more fit; False if they cannot.

        Prefixes that streams are using now are left alone: evicting them would free nothing yet.
        """
        if self.used_bytes + nbytes <= self.limit_bytes:
            return True
        idle = sum(e.nbytes for e in self._voices.values() if e.refs == 0)
        if self.used_bytes - idle + nbytes > self.limit_bytes:
            return False
        for entry in [e for e in self._voices.values() if e.refs == 0]:
            if self.used_bytes + nbytes <= self.limit_bytes:
                break
            self._unregister(entry)
            self.counts["voice_evictions"] += 1
        return True

    # -- streams -------------------------------------------------------------------------------

    def _reserve_stream(self, nbytes: int) -> bool:
        if not self._make_room(nbytes):
            self.counts["stream_refusals"] += 1
            return False
        self.stream_bytes += nbytes
        return True

    def _release_stream(self, nbytes: int) -> None:
        self.stream_bytes -= nbytes


@dataclass(eq=False)
class FlowRowCache:
    """The cached chunks of one token2wav stream: a shared voice prefix, then its own segments."""

    manager: FlowCacheManager
    voice: object | None  # identifies the prompt; its voice-only chunks may become the shared prefix
    _voice_entry: _VoiceEntry | None = None
    own: list[ChunkSegment] = field(default_factory=list)
    key: CacheKey | None = None
    own_bytes: int = 0
    released: bool = False
    _looked_up: bool = False  # the voice registry is consulted once, at the stream's first call

    @property
    def segments(self) -> list[ChunkSegment]:
        base = self._voice_entry.segments if self._voice_entry is not None else []
        return [*base, *self.own]

    @property
    def frames(self) -> int:
        segments = self.segments
        return segments[-1].end if segments else 0

    def usable(self, key: CacheKey, limit: int) -> list[ChunkSegment]:
        """The cached segments a call with ``key`` may start from, ending at or before frame ``limit``."""
        if self.released:
            return []
        if self.key is not None and self.key != key:
            self.reset()
        if self._voice_entry is not None and self._voice_entry.key != key:
            self.manager._release_voice_ref(self._voice_entry)
            self._voice_entry = None
        if not self._looked_up and self.voice is not None and not self.own:
            self._looked_up = True
            self._voice_entry = self.manager._attach(self.voice, key)
        out = []
        for segment in self.segments:
            if segment.end > limit:
                break
            out.append(segment)
        return out

    @property
    def wants_voice_prefix(self) -> bool:
        """Whether this stream's voice-only chunks should be offered as the voice's shared prefix."""
        return self.voice is not None and self._voice_entry is None and not self.own

    def store(self, key: CacheKey, keep: list[ChunkSegment], new: list[ChunkSegment], voice_end: int) -> None:
        """After a call: the row started from ``keep`` and computed ``new`` (contiguous after it).

        Segments ending at or before ``voice_end`` hold only voice-determined frames; they are offered
        to the manager as the voice's prefix when this stream started without one.
        """
        if self.released:
            return
        if self.key is not None and self.key != key:
            self.reset()
        self.key = key
        shared = len(self._voice_entry.segments) if self._voice_entry is not None else 0
        if len(keep) < shared:  # started inside the voice prefix (an odd caller): keep nothing
            self.reset()
            self.key = key
            return
        if len(keep) - shared < len(self.own):  # started before our last segment: drop the rest
            self._drop_own(self.own[len(keep) - shared :])
        if self.wants_voice_prefix and new and new[0].start == 0:
            prefix = [s for s in new if s.end <= voice_end]
            if prefix:
                entry = self.manager.offer_voice(self.voice, key, prefix)
                if entry is not None:
                    entry.refs += 1
                    self._voice_entry = entry
                    new = new[len(prefix) :]
        for segment in new:
            if not self.manager._reserve_stream(segment.nbytes):
                break  # no room: the next hop recomputes from the end of what is kept
            self.own.append(segment)
            self.own_bytes += segment.nbytes

    def room_for(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit the budget (evicting least recently used voice prefixes)."""
        if self.released:
            return False
        if self.manager._make_room(nbytes):
            return True
        self.manager.counts["stream_refusals"] += 1
        return False

    def reset(self) -> None:
        """Drop everything (the settings changed); the voice prefix is let go too."""
        self._drop_own(list(self.own))
        if self._voice_entry is not None:
            self.manager._release_voice_ref(self._voice_entry)
            self._voice_entry = None
        self.key = None

    def release(self) -> None:
        """The stream is finished or gone: give every byte back (idempotent)."""
        if not self.released:
            self.reset()
            self.released = True

    def _drop_own(self, segments: list[ChunkSegment]) -> None:
        for segment in segments:
            self.own.remove(segment)
            self.own_bytes -= segment.nbytes
            self.manager._release_stream(segment.nbytes)
