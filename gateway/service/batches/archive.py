"""A job's results as one streamed archive: its audio files plus ``manifest.jsonl``, zip or tar.

The standard library writes both formats to a stream that cannot seek (zipfile then uses data
descriptors, tarfile's ``w|`` mode is a stream), so the archive is written by a thread into a bounded
queue and sent as it is made: nothing is spooled to disk, and memory holds at most ``QUEUE_PIECES``
pieces. A client that goes away stops the writer at its next piece.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import queue
import re
import tarfile
import threading
import time
import zipfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ArchiveEntry", "archive_name", "stream_archive"]

QUEUE_PIECES = 16
PIECE_BYTES = 256 * 1024
PUT_WAIT_S = 1.0  # the writer checks for a stop this often while the client is slow
CLIENT_WAIT_S = 300.0  # a client that reads nothing for this long loses the download
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_END = object()


@dataclass(frozen=True)
class ArchiveEntry:
    """One item: where its file is (None: no audio) and the manifest line."""

    path: Path | None
    name: str | None  # in the archive
    manifest: dict[str, object]


def archive_name(custom_id: str, idx: int, fmt: str, taken: set[str]) -> str:
    """A safe, unique file name for an item, from its custom_id."""
    base = _UNSAFE.sub("_", custom_id).strip("._")[:120] or f"item-{idx}"
    name = f"{base}.{fmt}"
    if name in taken:
        name = f"{base}-{idx}.{fmt}"
    taken.add(name)
    return name


class _QueueWriter(io.RawIOBase):
    """A write-only, non-seekable file whose bytes go into a bounded queue, in pieces."""

    def __init__(self, pieces: queue.Queue[object], stop: threading.Event) -> None:
        self._pieces = pieces
        self._stop = stop
        self._buffer = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        view = memoryview(data)  # type: ignore[arg-type]
        self._buffer += view
        while len(self._buffer) >= PIECE_BYTES:
            self._put(bytes(self._buffer[:PIECE_BYTES]))
            del self._buffer[:PIECE_BYTES]
        return view.nbytes

    def flush_all(self) -> None:
        if self._buffer:
            self._put(bytes(self._buffer))
            self._buffer.clear()

    def _put(self, piece: object) -> None:
        deadline = time.monotonic() + CLIENT_WAIT_S
        while True:
            if self._stop.is_set():
                raise OSError("the download was stopped")
            try:
                self._pieces.put(piece, timeout=PUT_WAIT_S)
                return
            except queue.Full:
                if time.monotonic() > deadline:
                    raise OSError("the client stopped reading") from None


def _write(entries: Sequence[ArchiveEntry], fmt: str, out: _QueueWriter) -> None:
    manifest = "".join(json.dumps(e.manifest, ensure_ascii=False) + "\n" for e in entries).encode()
    if fmt == "zip":
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            for entry in entries:
                if entry.path is not None and entry.name is not None:
                    archive.write(entry.path, entry.name)
            archive.writestr("manifest.jsonl", manifest, compress_type=zipfile.ZIP_DEFLATED)
    else:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            for entry in entries:
                if entry.path is not None and entry.name is not None:
                    archive.add(entry.path, arcname=entry.name, recursive=False)
            info = tarfile.TarInfo("manifest.jsonl")
            info.size, info.mtime = len(manifest), int(time.time())
            archive.addfile(info, io.BytesIO(manifest))
    out.flush_all()


async def stream_archive(entries: Sequence[ArchiveEntry], fmt: str) -> AsyncIterator[bytes]:
    """The archive's bytes as they are written (see the module docstring)."""
    pieces: queue.Queue[object] = queue.Queue(QUEUE_PIECES)
    stop = threading.Event()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            _write(entries, fmt, _QueueWriter(pieces, stop))
        except BaseException as exc:  # noqa: BLE001 - reported to the reader
            failure.append(exc)
        finally:
            if not stop.is_set():
                try:
                    pieces.put(_END, timeout=CLIENT_WAIT_S)
                except queue.Full:
                    pass

    writer = threading.Thread(target=produce, name="batch archive", daemon=True)
    writer.start()
    try:
        while True:
            try:
                piece = await asyncio.to_thread(pieces.get, timeout=CLIENT_WAIT_S)
            except queue.Empty:
                raise OSError("the archive writer stalled") from None
            if piece is _END:
                break
            assert isinstance(piece, bytes)
            yield piece
        if failure:
            raise failure[0]
    finally:
        stop.set()
        while writer.is_alive():  # unblock a writer waiting for room, then let it end
            with contextlib.suppress(queue.Empty):
                pieces.get_nowait()
            await asyncio.to_thread(writer.join, PUT_WAIT_S)

