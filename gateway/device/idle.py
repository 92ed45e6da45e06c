"""When an idle session closes (`session` in config.yaml), kept by one `IdleClock` per session.

Before `hello` the deadline is HELLO_TIMEOUT_S. Then `idle_no_voice_s` (the session section's, or the
device's agent's: `set_limits`) counts from the later of
the user's last words (speech or typed text) and the end of the server's last reply, and stands
still while a reply or a recognition runs; `idle_hard_s` counts from the user's last words whatever
else happens. `expired()` sleeps until the earlier deadline and is woken only when a reply or a
recognition ends or hello arrives (the only events that can bring a deadline closer).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from gateway.config import SessionConfig

HELLO_TIMEOUT_S = 10.0


class IdleClock:
    def __init__(self, cfg: SessionConfig, *, busy: Callable[[], bool]) -> None:
        self.no_voice_s = cfg.idle_no_voice_s  # the device's agent may set others (set_limits)
        self.hard_s = cfg.idle_hard_s
        self._busy = busy  # a reply is playing or an utterance is being recognised
        self.started = time.monotonic()
        self.hello_done = False
        self._voice_at = self.started  # the user last spoke or typed
        self._quiet_since = self.started  # the last reply or recognition ended
        self._wake = asyncio.Event()  # a deadline may have come closer
        self.wakeups = 0

    def greeted(self) -> None:
        """Hello arrived: the idle deadlines replace the hello deadline."""
        self.hello_done = True
        self._wake.set()

    def set_limits(self, no_voice_s: float, hard_s: float) -> None:
        """The device's agent's idle timeouts, from now on (the deadline is recomputed at once)."""
        if (no_voice_s, hard_s) != (self.no_voice_s, self.hard_s):
            self.no_voice_s, self.hard_s = no_voice_s, hard_s
            self._wake.set()

    def heard_voice(self) -> None:
        self._voice_at = time.monotonic()

    def became_quiet(self, _task: object = None) -> None:
        """A reply or recognition ended (a task's done callback)."""
        self._quiet_since = time.monotonic()
        self._wake.set()

    def deadline(self) -> tuple[str, float]:
        """The next reason to close, and when."""
        if not self.hello_done:
            return "no hello", self.started + HELLO_TIMEOUT_S
        hard = ("no speech for idle_hard_s", self._voice_at + self.hard_s)
        if self._busy():
            return hard
        soft = ("no speech", max(self._voice_at, self._quiet_since) + self.no_voice_s)
        return min(soft, hard, key=lambda item: item[1])

    async def expired(self, closing: Callable[[], bool]) -> str | None:
        """Waits for the deadline: one sleep per deadline, no polling; its reason (None: closing anyway).

        Voice only moves deadlines later, so it does not wake the clock: at the old deadline it
        recomputes and sleeps again.
        """
        while not closing():
            reason, deadline = self.deadline()
            now = time.monotonic()
            if now >= deadline:
                return reason
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - now):
                    await self._wake.wait()
            self.wakeups += 1
        return None
