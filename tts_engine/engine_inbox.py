"""The engine thread's inbox: the commands any thread puts in it for ``EngineLoop``
(tts_engine/engine_loop.py), and what a ``call``'s outcome is on its way back to the event loop.

New requests come as one command per event-loop tick (``NewRequests``), aborts, ``Call``s (a backend call
run between steps, voices), a resume (a consumer made room under the buffer bound) and the shutdown.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tts_engine.backends.base import Backend
from tts_engine.request import EngineRequest


@dataclass(frozen=True, slots=True)
class NewRequests:
    """Requests submitted together (one event-loop tick): the thread sees all of them or none, so a
    burst is admitted and prefilled in one step instead of spread over the steps of a racing wake-up."""

    requests: tuple[EngineRequest, ...]


@dataclass(frozen=True, slots=True)
class Abort:
    req_id: str


@dataclass(frozen=True, slots=True)
class Call:
    """Run ``fn`` in the engine thread between steps; its outcome goes to ``future`` on the loop."""

    fn: Callable[[], Any]
    future: asyncio.Future[Any]


class Resume:
    """A consumer made room under the buffer bound; the command itself carries nothing."""


class Shutdown:
    pass


RESUME = Resume()
SHUTDOWN = Shutdown()
Command = NewRequests | Abort | Call | Resume | Shutdown


class Inbox(queue.Queue):
    """The engine thread's command queue; every put also wakes a backend blocked in its own wait
    (``Backend.wake``), so a new request or an abort is seen at once, not when that wait ends."""

    def __init__(self, backend: Backend) -> None:
        super().__init__()
        self._backend = backend

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        self._backend.wake()


CallOutcome = tuple[asyncio.Future[Any], Any, BaseException | None, Any]
"""A ``call``'s future, its result, its error, and the backend's (voices, default voice) after it."""
