"""A per-key sliding-window rate limit (keys: client addresses), bounded in memory.

Each key keeps the times of its last ``limit`` events; an event is allowed while fewer than ``limit``
happened within ``window_s``. At most ``max_keys`` keys are kept (the least recently used is dropped),
so a flood of addresses costs bounded memory. Per gateway process: behind a load balancer each gateway
counts its own share of a client's events.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque


class RateLimit:
    def __init__(self, limit: int, window_s: float = 3600.0, *, max_keys: int = 10000) -> None:
        if limit < 1 or window_s <= 0 or max_keys < 1:
            raise ValueError("limit and max_keys must be >= 1, window_s > 0")
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._events: OrderedDict[str, deque[float]] = OrderedDict()

    def allowed(self, key: str, *, now: float | None = None) -> bool:
        """Whether one more event of ``key`` fits now (nothing is counted)."""
        now = time.monotonic() if now is None else now
        events = self._events.get(key)
        return events is None or len(events) < self.limit or events[0] <= now - self.window_s

    def hit(self, key: str, *, now: float | None = None) -> bool:
        """Counts one event of ``key`` if it fits; whether it did."""
        now = time.monotonic() if now is None else now
        if not self.allowed(key, now=now):
            return False
        events = self._events.get(key)
        if events is None:
            events = self._events[key] = deque(maxlen=self.limit)
            while len(self._events) > self.max_keys:
                self._events.popitem(last=False)
        self._events.move_to_end(key)
        events.append(now)
        return True

    def retry_after(self, key: str, *, now: float | None = None) -> float:
        """Seconds until ``key`` may have another event (0 when it may now)."""
        now = time.monotonic() if now is None else now
        events = self._events.get(key)
        if events is None or len(events) < self.limit:
            return 0.0
        return max(0.0, events[0] + self.window_s - now)
