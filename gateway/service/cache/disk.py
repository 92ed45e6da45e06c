"""The cache's disk tier: one file per entry in a folder, bounded in bytes, crash-safe.

Layout: ``<dir>/<voice>/<key>.xzc`` (the voice's folder goes as a whole when the voice is replaced or
deleted). A file is ``XZAC1\\n``, the header's length (4 bytes, little-endian), the header (JSON: key,
voice, rate, chunk sizes, payload bytes and SHA-256), then the int16 PCM.

Crash safety: an entry is written to a temporary file in the same folder, flushed and fsync'ed, then
renamed over its final name (atomic on POSIX) and the folder fsync'ed. A process killed while writing
(``kill -9``) leaves only a temporary file, which is never read and is removed at the next start. Every
read checks the magic, the header, the payload's length and its SHA-256, so a file torn or damaged any
other way (a disk that lost writes, someone's editor) is dropped, never served.

Bounded: past ``budget_bytes`` the least recently used files go (reads refresh a file's mtime, so the
order survives restarts). All methods block; ``AudioCache`` calls them in threads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import struct
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from gateway.service.cache.entry import CachedAudio
from gateway.voices.files import sync_dir

__all__ = ["DiskTier"]

log = logging.getLogger(__name__)

MAGIC = b"XZAC1\n"
SUFFIX = ".xzc"
TMP_SUFFIX = ".tmp"
WRITE_PIECE = 64 * 1024  # bytes per write() call
STALE_TMP_S = 3600.0  # temporary files older than this are a killed writer's (another live one is quicker)
_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KEY = re.compile(r"[0-9a-f]{64}")
MAX_HEADER = 1 << 20


def voice_folder(voice: str) -> str:
    if not voice:
        return "_zero-shot"
    if _SAFE.fullmatch(voice):
        return voice
    return "v-" + hashlib.sha256(voice.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class DiskTier:
    def __init__(self, directory: Path, budget_bytes: int) -> None:
        self.dir = directory
        self.budget_bytes = budget_bytes
        self._index: OrderedDict[str, tuple[Path, int]] = OrderedDict()  # key -> (file, size), LRU first
        self._lock = threading.Lock()
        self.nbytes = 0
        self.evictions = 0
        self.torn = 0  # files found damaged and dropped

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def scan(self) -> None:
        """Indexes the folder (oldest use first) and removes killed writers' temporary files."""
        self.dir.mkdir(parents=True, exist_ok=True)
        found: list[tuple[float, str, Path, int]] = []
        now = time.time()
        for path in self.dir.glob("*/*"):
            try:
                stat = path.stat()
            except OSError:
                continue
            if path.name.endswith(TMP_SUFFIX):
                if now - stat.st_mtime > STALE_TMP_S:
                    path.unlink(missing_ok=True)
                continue
            key = path.name.removesuffix(SUFFIX)
            if path.suffix == SUFFIX and _KEY.fullmatch(key):
                found.append((stat.st_mtime, key, path, stat.st_size))
        found.sort()
        with self._lock:
            self._index = OrderedDict((key, (path, size)) for _, key, path, size in found)
            self.nbytes = sum(size for _, _, _, size in found)
        self._evict()

    def read(self, key: str) -> CachedAudio | None:
        with self._lock:
            found = self._index.get(key)
        if found is None:
            return None
        path, _ = found
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._forget(key)
            return None
        entry = _decode(data, key)
        if entry is None:
            self.torn += 1
            log.warning("audio cache: %s is damaged; dropped", path)
            self._forget(key)
            path.unlink(missing_ok=True)
            return None
        try:
            os.utime(path)
        except OSError:
            pass
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
        return entry

    def write(self, entry: CachedAudio) -> None:
        """Writes ``entry`` (temporary file, fsync, rename, folder fsync), then keeps the folder in budget."""
        if entry.nbytes > self.budget_bytes:
            return
        folder = self.dir / voice_folder(entry.voice)
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{entry.key}{SUFFIX}"
        tmp = folder / f".{entry.key}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
        payload = memoryview(np.ascontiguousarray(entry.pcm, dtype="<i2").tobytes())
        header = json.dumps({
            "key": entry.key, "voice": entry.voice, "rate": entry.sample_rate, "chunks": list(entry.chunks),
            "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
        }).encode()  # fmt: skip
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header)
                for at in range(0, len(payload), WRITE_PIECE):
                    f.write(payload[at : at + WRITE_PIECE])
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            sync_dir(folder)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.warning("audio cache: cannot write %s: %s", final, exc)
            return
        size = final.stat().st_size
        with self._lock:
            old = self._index.pop(entry.key, None)
            if old is not None:
                self.nbytes -= old[1]
            self._index[entry.key] = (final, size)
            self.nbytes += size
        self._evict()

    def drop_voice(self, voice: str) -> int:
        """Removes every entry of ``voice``; how many."""
        folder = self.dir / voice_folder(voice)
        with self._lock:
            keys = [key for key, (path, _) in self._index.items() if path.parent == folder]
            for key in keys:
                self.nbytes -= self._index.pop(key)[1]
        for path in folder.glob(f"*{SUFFIX}"):
            path.unlink(missing_ok=True)
        return len(keys)

    def _forget(self, key: str) -> None:
        with self._lock:
            old = self._index.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]

    def _evict(self) -> None:
        while True:
            with self._lock:
                if self.nbytes <= self.budget_bytes or not self._index:
                    return
                _, (path, size) = self._index.popitem(last=False)
                self.nbytes -= size
                self.evictions += 1
            path.unlink(missing_ok=True)


def _decode(data: bytes, key: str) -> CachedAudio | None:
    """The entry in ``data``, or None when anything about it is wrong."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        return None
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    if length > MAX_HEADER or start + length > len(data):
        return None
    try:
        header = json.loads(data[start : start + length])
        payload = memoryview(data)[start + length :]
        if header["key"] != key or header["bytes"] != len(payload) or len(payload) % 2:
            return None
        if hashlib.sha256(payload).hexdigest() != header["sha256"]:
            return None
        chunks = tuple(int(c) for c in header["chunks"])
        rate = int(header["rate"])
        voice = str(header["voice"])
    except (ValueError, KeyError, TypeError):
        return None
    pcm = np.frombuffer(payload, dtype="<i2").astype(np.int16)
    if sum(chunks) != pcm.size or rate <= 0:
        return None
    pcm.flags.writeable = False
    return CachedAudio(key, voice, rate, pcm, chunks)
