"""A stdio MCP server's stderr, read through a pipe: its lines go to our log (debug), the last few are
kept for the warning when the server fails, and the end of the pipe says the process has exited.

The SDK's `stdio_client` takes a file for the child's stderr (`errlog`) and gives no other sign that the
process died between two calls; a pipe we read ourselves gives both (no polling)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable
from typing import TextIO

log = logging.getLogger(__name__)

KEPT_LINES = 20
MAX_LINE_BYTES = 8192


class StderrPipe:
    """Create it before spawning; pass ``errlog`` to the SDK; call ``spawned()`` once the child runs."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tail: deque[str] = deque(maxlen=KEPT_LINES)
        read_fd, write_fd = os.pipe()
        self._read_file = os.fdopen(read_fd, "rb", buffering=0)
        self.errlog: TextIO = os.fdopen(write_fd, "w")

    def spawned(self) -> None:
        """Close our copy of the write end: the pipe then ends when the child (and its children) exit."""
        if not self.errlog.closed:
            self.errlog.close()

    async def read(self, on_end: Callable[[], None]) -> None:
        """Log the child's stderr lines until the pipe ends, then call ``on_end``. The pipe ends only
        after ``spawned()`` (or ``close()``), whether or not the spawn worked."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), self._read_file
        )
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # a line longer than the limit: its start was dropped
                    continue
                if not line:
                    break
                text = line.decode("utf-8", "replace").rstrip()
                if text.strip():
                    self.tail.append(text)
                    log.debug("mcp[%s] %s", self.label, text)
        finally:
            transport.close()
        on_end()

    def recent(self) -> str:
        return " | ".join(line.strip() for line in self.tail)

    def close(self) -> None:
        self.spawned()
        if not self._read_file.closed:
            self._read_file.close()
