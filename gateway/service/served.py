"""One API request as the service sees it: whose, what it cost, when its first byte left, how it ended.

The HTTP guard (gateway/security/http_guard.py) makes a ``Served`` for every request that carries an
account, before its body is read, and calls ``finish()`` however the answer ends; the speech endpoints
fill in its characters, admission ticket and audio (``CountingStream``). ``finish()`` meters it (the usage
meter and the metrics) and then releases its ticket (its stream slot and its characters' reservation).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gateway.service.accounts import Account
from gateway.service.cache.streams import PassThroughStream
from gateway.service.limits import SpeechTicket
from tts_engine.interface import SpeechStream

__all__ = ["CountingStream", "Served"]


@dataclass(eq=False)
class Served:
    account: Account
    started: float = field(default_factory=time.monotonic)
    characters: int = 0  # of a speech request (0: not one)
    audio_s: float = 0.0  # produced for it
    first_byte_at: float | None = None
    status: int | None = None
    failed: bool = False  # the answer broke off after its headers
    cache: str | None = None  # "hit" / "miss" for speech requests the cache saw
    ticket: SpeechTicket | None = None
    finished: bool = False

    @property
    def speech(self) -> bool:
        return self.characters > 0

    @property
    def first_byte_s(self) -> float | None:
        return None if self.first_byte_at is None else self.first_byte_at - self.started

    @property
    def error(self) -> bool:
        return self.failed or self.status is None or self.status >= 400

    def finish(self, report: Callable[[Served], None]) -> None:
        """Meters it once (``report``), then releases its admission."""
        if self.finished:
            return
        self.finished = True
        try:
            report(self)
        finally:
            if self.ticket is not None:
                self.ticket.release()


class CountingStream(PassThroughStream):
    """A speech stream whose audio seconds (and failure) are added to a ``Served``."""

    def __init__(self, inner: SpeechStream, served: Served) -> None:
        super().__init__(inner)
        self.served = served

    async def __anext__(self) -> np.ndarray:
        try:
            chunk = await self.inner.__anext__()
        except StopAsyncIteration:
            if self.served.ticket is not None:
                self.served.ticket.end_stream()  # before the answer's last bytes: the slot is free by then
            raise
        except Exception:
            self.served.failed = True
            raise
        self.served.audio_s += chunk.size / self.sample_rate
        return chunk
