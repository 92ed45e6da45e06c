"""A process that writes audio cache entries to a folder and is killed (kill -9) in the middle of one.

    python -m tests.cache_writer DIR N    # writes entries 0..N-1 whole (prints "wrote K" after each), then
                                          # entry N: half its bytes written to the temporary file, prints
                                          # "mid N" and blocks until killed

Entry K is ``entry(K)``: its PCM is a pattern of K, so a reader can tell its bytes are right. Used by
tests/test_service_cache.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import gateway.service.cache.disk as disk
from gateway.service.cache.entry import CachedAudio, speech_key

SAMPLES = 200_000  # 400 KB of PCM: several write pieces


def key_of(k: int) -> str:
    return speech_key(f"sentence {k}", voice="default", voice_revision="r", speed=1.0, instruct=None,
                      output_rate=24000, model_revision="m")  # fmt: skip


def entry(k: int) -> CachedAudio:
    pcm = ((np.arange(SAMPLES, dtype=np.int64) * (k + 3)) % 20011 - 10005).astype(np.int16)
    return CachedAudio.of(key_of(k), "default", 24000, [pcm[: SAMPLES // 2], pcm[SAMPLES // 2 :]])


class _Stopping:
    """A file whose writes stop half way: announces it, then blocks until the process is killed."""

    def __init__(self, inner, total: int, k: int) -> None:
        self.inner, self.total, self.k, self.written = inner, total, k, 0

    def write(self, data) -> int:
        if self.written + len(data) > self.total // 2:
            self.inner.flush()
            print(f"mid {self.k}", flush=True)
            sys.stdin.readline()
            raise SystemExit("not killed")
        self.written += len(data)
        return self.inner.write(data)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.inner.close()


def main() -> None:
    folder, n = Path(sys.argv[1]), int(sys.argv[2])
    tier = disk.DiskTier(folder, 1 << 30)
    tier.scan()
    for k in range(n):
        tier.write(entry(k))
        print(f"wrote {k}", flush=True)
    real_open = open
    total = SAMPLES * 2

    def stopping_open(path, mode="r", *args, **kw):
        f = real_open(path, mode, *args, **kw)
        return _Stopping(f, total, n) if "w" in mode else f

    disk.open = stopping_open  # type: ignore[attr-defined]  # the module's open(), only here
    tier.write(entry(n))


if __name__ == "__main__":
    main()
