"""Per-account limits, checked before any work starts: requests per second with a burst, characters per
minute, concurrent streams, a daily or monthly quota.

Rates are token buckets (requests: ``burst`` deep, refilled at ``rps``; characters: ``chars_per_minute``
deep, refilled at a sixtieth of that per second). Every check-and-take is plain synchronous code on the
gateway's event loop, with no ``await`` between looking at a bucket and taking from it, so concurrent
requests cannot race past a limit: of N requests arriving at once against a burst of B, exactly B pass.
(Limits are per gateway process; quotas count the usage every gateway wrote to the shared store.)

A request over a limit gets ``RateLimited``, which the API answers as OpenAI does, so the official SDK's
retry logic works unchanged: 429 with ``Retry-After`` (whole seconds) and ``retry-after-ms``, an
OpenAI-shaped error (``rate_limit_exceeded``, or ``insufficient_quota`` with ``x-should-retry: false``:
waiting seconds does not help), and the ``x-ratelimit-*`` headers (``limit``/``remaining``/``reset`` for
``requests`` and for characters as ``tokens``), which also go out with every answer of a limited key.
"""

from __future__ import annotations

import calendar
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway.service.accounts import Account, Limits

__all__ = ["Limiter", "RateLimited", "SpeechTicket", "TokenBucket", "duration_text", "period_reset_s"]


class RateLimited(Exception):
    """A request over one of its account's limits; ``status`` 429 (400 for text that can never fit)."""

    def __init__(self, message: str, *, code: str, retry_after_s: float | None,
                 headers: dict[str, str], status: int = 429, kind: str = "requests") -> None:  # fmt: skip
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.kind = kind  # requests, characters, streams, quota: the metric's label
        self.headers = dict(headers)
        if retry_after_s is not None:
            self.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
            self.headers["retry-after-ms"] = str(max(1, math.ceil(retry_after_s * 1000)))
        if code == "insufficient_quota":
            self.headers["x-should-retry"] = "false"


class TokenBucket:
    """``capacity`` tokens, refilled at ``rate`` per second; the clock is ``time.monotonic``."""

    def __init__(self, rate: float, capacity: float, *, now: float | None = None) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.stamp = time.monotonic() if now is None else now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait_for(self, n: float, now: float) -> float:
        """Seconds until ``n`` tokens are there (0: now)."""
        self._refill(now)
        missing = n - self.tokens
        return 0.0 if missing <= 1e-9 else missing / self.rate

    def take(self, n: float, now: float) -> None:
        self._refill(now)
        self.tokens -= n

    def remaining(self, now: float) -> int:
        self._refill(now)
        return max(0, math.floor(self.tokens + 1e-9))

    def full_in(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        self._refill(now)
        return max(0.0, (self.capacity - self.tokens) / self.rate)


def duration_text(seconds: float) -> str:
    """OpenAI's ``x-ratelimit-reset-*`` form: ``20ms``, ``1s``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    ms = math.ceil(max(0.0, seconds) * 1000)
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def period_reset_s(period: str, now: float | None = None) -> float:
    """Seconds until the next UTC day or month starts."""
    at = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    if period == "day":
        nxt = datetime(at.year, at.month, at.day, tzinfo=UTC).timestamp() + 86400
    else:
        days = calendar.monthrange(at.year, at.month)[1]
        nxt = datetime(at.year, at.month, 1, tzinfo=UTC).timestamp() + days * 86400
    return max(1.0, nxt - at.timestamp())


@dataclass
class _State:
    """One account's buckets and counters in this process."""

    limits: Limits
    requests: TokenBucket | None
    chars: TokenBucket | None
    streams: int = 0
    reserved_chars: int = 0  # admitted characters not yet in the usage meter (quota)
    tickets: set[SpeechTicket] = field(default_factory=set)


@dataclass(eq=False)
class SpeechTicket:
    """An admitted speech request: holds a stream slot and its characters' reservation until released."""

    account: Account
    chars: int
    _state: _State | None
    released: bool = False
    stream_ended: bool = False  # its audio is all out: the stream slot is free, the characters still held

    def end_stream(self) -> None:
        """Free the stream slot once the audio has ended, before the answer's last bytes go out, so a
        client that starts its next request when one ends never finds its slot still taken. The
        characters stay reserved until ``release`` (after the usage meter has them)."""
        if self.stream_ended or self.released:
            return
        self.stream_ended = True
        if self._state is not None:
            self._state.streams -= 1

    def release(self) -> None:
        if self.released:
            return
        self.end_stream()
        self.released = True
        if self._state is not None:
            self._state.reserved_chars -= self.chars
            self._state.tickets.discard(self)


# (characters, audio seconds) the account used in its quota period so far, from the usage meter
UsedFn = Callable[[Account], tuple[int, float]]


class Limiter:
    """Every account's limits in this process (module docstring)."""

    def __init__(self, used: UsedFn | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._states: dict[str, _State] = {}
        self._used = used or (lambda account: (0, 0.0))
        self._clock = clock

    def _state(self, account: Account) -> _State:
        state = self._states.get(account.name)
        limits = account.limits
        if state is None or state.limits != limits:  # new, or its limits changed (keys are re-read)
            now = self._clock()
            burst = limits.request_burst
            requests = TokenBucket(limits.rps, burst, now=now) if limits.rps is not None and burst else None
            cpm = limits.chars_per_minute
            chars = TokenBucket(cpm / 60.0, cpm, now=now) if cpm else None
            old = state
            state = _State(limits=limits, requests=requests, chars=chars)
            if old is not None:  # in-flight work keeps counting
                state.streams, state.reserved_chars, state.tickets = old.streams, old.reserved_chars, old.tickets
                for ticket in state.tickets:
                    ticket._state = state
            self._states[account.name] = state
        return state

    def headers(self, account: Account) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers of ``account`` now (empty for an account without rate limits)."""
        if account.limits.unlimited:
            return {}
        state = self._state(account)
        now = self._clock()
        headers: dict[str, str] = {}
        if state.requests is not None:
            headers["x-ratelimit-limit-requests"] = str(int(state.requests.capacity))
            headers["x-ratelimit-remaining-requests"] = str(state.requests.remaining(now))
            headers["x-ratelimit-reset-requests"] = duration_text(state.requests.full_in(now))
        if state.chars is not None:
            headers["x-ratelimit-limit-tokens"] = str(int(state.chars.capacity))
            headers["x-ratelimit-remaining-tokens"] = str(state.chars.remaining(now))
            headers["x-ratelimit-reset-tokens"] = duration_text(state.chars.full_in(now))
        return headers

    def admit_request(self, account: Account) -> None:
        """One request of ``account`` (any API route), before its body is read: ``RateLimited`` past its
        requests per second."""
        if account.limits.rps is None:
            return
        state = self._state(account)
        bucket = state.requests
        if bucket is None:
            return
        now = self._clock()
        wait = bucket.wait_for(1, now)
        if wait > 0:
            limit = account.limits
            raise RateLimited(
                f"rate limit reached for key {account.name!r}: {limit.rps:g} requests per second "
                f"(burst {limit.request_burst}); try again in {duration_text(wait)}",
                code="rate_limit_exceeded", retry_after_s=wait, headers=self.headers(account), kind="requests",
            )  # fmt: skip
        bucket.take(1, now)

    def admit_speech(self, account: Account, chars: int) -> SpeechTicket:
        """A speech request of ``chars`` characters: its characters per minute, a stream slot and its quota,
        all checked before any is taken. The caller releases the ticket when the answer is over (after the
        usage meter has recorded it)."""
        limits = account.limits
        if limits.unlimited:
            return SpeechTicket(account, chars, None)
        state = self._state(account)
        now = self._clock()
        if state.chars is not None:
            cap = int(state.chars.capacity)
            if chars > cap:
                raise RateLimited(
                    f"this request has {chars} characters, more than key {account.name!r} may send in a minute "
                    f"({cap}); split the text", code="text_over_rate_limit", retry_after_s=None,
                    headers=self.headers(account), status=400, kind="characters",
                )  # fmt: skip
            wait = state.chars.wait_for(chars, now)
            if wait > 0:
                raise RateLimited(
                    f"rate limit reached for key {account.name!r}: {cap} characters per minute; this request "
                    f"({chars} characters) fits in {duration_text(wait)}", code="rate_limit_exceeded",
                    retry_after_s=wait, headers=self.headers(account), kind="characters",
                )  # fmt: skip
        if limits.max_streams is not None and state.streams >= limits.max_streams:
            raise RateLimited(
                f"key {account.name!r} has {state.streams} streams in flight, its limit is {limits.max_streams}; "
                "try again when one ends", code="rate_limit_exceeded", retry_after_s=1.0,
                headers=self.headers(account), kind="streams",
            )  # fmt: skip
        self._check_quota(account, state, chars)
        if state.chars is not None:
            state.chars.take(chars, now)
        ticket = SpeechTicket(account, chars, state)
        state.streams += 1
        state.reserved_chars += chars
        state.tickets.add(ticket)
        return ticket

    def _check_quota(self, account: Account, state: _State, chars: int) -> None:
        limits = account.limits
        if limits.quota_chars is None and limits.quota_audio_s is None:
            return
        used_chars, used_audio = self._used(account)
        period = limits.quota_period
        reset = period_reset_s(period)
        if limits.quota_chars is not None and used_chars + state.reserved_chars + chars > limits.quota_chars:
            left = max(0, limits.quota_chars - used_chars - state.reserved_chars)
            raise RateLimited(
                f"key {account.name!r} has used its quota of {limits.quota_chars} characters per {period} "
                f"({left} left, this request has {chars}); it renews in {duration_text(reset)}",
                code="insufficient_quota", retry_after_s=reset, headers=self.headers(account), kind="quota",
            )  # fmt: skip
        if limits.quota_audio_s is not None and used_audio >= limits.quota_audio_s:
            raise RateLimited(
                f"key {account.name!r} has used its quota of {limits.quota_audio_s:g} seconds of audio per "
                f"{period}; it renews in {duration_text(reset)}",
                code="insufficient_quota", retry_after_s=reset, headers=self.headers(account), kind="quota",
            )  # fmt: skip

    def in_flight(self, account: Account) -> int:
        state = self._states.get(account.name)
        return 0 if state is None else state.streams
