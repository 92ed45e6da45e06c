"""Keys as accounts and their limits (gateway/service/accounts.py, limits.py): burst, refill, characters
per minute, concurrent streams and quotas, unit by unit on a clock of the test's own, then on a real
gateway with concurrent requests racing at a limit, and the 429s as the official ``openai`` SDK reads
them (its retry waits ``Retry-After`` and goes on; ``insufficient_quota`` is not retried)."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from gateway.service.accounts import Account, KeyStore, Limits
from gateway.service.limits import Limiter, RateLimited, duration_text
from tests.api_helpers import fake, slow
from tests.gateway_server import RunningGateway, running_gateway


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def account(**limits) -> Account:
    return Account(name="alice", limits=Limits(**limits))


# ---- the limiter on its own ---------------------------------------------------------------------


def test_a_burst_passes_then_the_bucket_refills_at_its_rate() -> None:
    clock = Clock()
    limiter = Limiter(clock=clock)
    alice = account(rps=2.0, burst=3)
    for _ in range(3):
        limiter.admit_request(alice)
    with pytest.raises(RateLimited) as refused:
        limiter.admit_request(alice)
    exc = refused.value
    assert exc.status == 429 and exc.code == "rate_limit_exceeded"
    assert exc.headers["Retry-After"] == "1" and exc.headers["retry-after-ms"] == "500"
    assert exc.headers["x-ratelimit-limit-requests"] == "3"
    assert exc.headers["x-ratelimit-remaining-requests"] == "0"
    assert exc.headers["x-ratelimit-reset-requests"] == "1.5s"  # empty to full at 2/s
    clock.now += 0.49
    with pytest.raises(RateLimited):
        limiter.admit_request(alice)
    clock.now += 0.02  # 0.51 s: one token back
    limiter.admit_request(alice)
    with pytest.raises(RateLimited):
        limiter.admit_request(alice)
    clock.now += 10  # never more than the burst
    for _ in range(3):
        limiter.admit_request(alice)
    with pytest.raises(RateLimited):
        limiter.admit_request(alice)


def test_characters_per_minute_and_a_text_that_can_never_fit() -> None:
    clock = Clock()
    limiter = Limiter(clock=clock)
    alice = account(chars_per_minute=120)  # 2 characters a second
    limiter.admit_speech(alice, 100).release()
    with pytest.raises(RateLimited) as refused:
        limiter.admit_speech(alice, 30)  # 20 left: 10 more take 5 s
    assert refused.value.headers["Retry-After"] == "5"
    assert refused.value.headers["x-ratelimit-limit-tokens"] == "120"
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "20"
    clock.now += 5.0
    limiter.admit_speech(alice, 30).release()
    with pytest.raises(RateLimited) as never:
        limiter.admit_speech(alice, 121)
    assert never.value.status == 400 and never.value.code == "text_over_rate_limit"


def test_concurrent_streams_are_counted_until_released() -> None:
    limiter = Limiter(clock=Clock())
    alice = account(max_streams=2)
    first, second = limiter.admit_speech(alice, 5), limiter.admit_speech(alice, 5)
    with pytest.raises(RateLimited) as refused:
        limiter.admit_speech(alice, 5)
    assert refused.value.kind == "streams" and refused.value.headers["Retry-After"] == "1"
    first.release()
    first.release()  # twice is once
    third = limiter.admit_speech(alice, 5)
    assert limiter.in_flight(alice) == 2
    second.release()
    third.end_stream()  # its audio ended: the slot is free before the answer is over
    assert limiter.in_flight(alice) == 0
    third.release()
    assert limiter.in_flight(alice) == 0  # not freed twice
    fourth, fifth = limiter.admit_speech(alice, 5), limiter.admit_speech(alice, 5)
    assert limiter.in_flight(alice) == 2
    fourth.release()
    fifth.release()


def test_a_quota_counts_what_was_used_and_what_is_in_flight() -> None:
    used = {"chars": 90}
    limiter = Limiter(lambda a: (used["chars"], 0.0), clock=Clock())
    alice = account(quota_chars=100, quota_period="month")
    with pytest.raises(RateLimited) as refused:
        limiter.admit_speech(alice, 11)
    exc = refused.value
    assert exc.code == "insufficient_quota" and exc.headers["x-should-retry"] == "false"
    assert int(exc.headers["Retry-After"]) >= 1
    ticket = limiter.admit_speech(alice, 6)  # in flight: 96 of 100
    with pytest.raises(RateLimited):
        limiter.admit_speech(alice, 5)
    ticket.end_stream()  # the audio ended, the meter does not have it yet: its characters still count
    with pytest.raises(RateLimited):
        limiter.admit_speech(alice, 5)
    ticket.release()
    used["chars"] = 96  # the meter has it now
    limiter.admit_speech(alice, 4).release()
    audio = account(quota_audio_s=10.0)
    spent = Limiter(lambda a: (0, 10.0), clock=Clock())
    with pytest.raises(RateLimited) as over:
        spent.admit_speech(audio, 1)
    assert over.value.code == "insufficient_quota"


def test_reset_durations_read_like_openais() -> None:
    assert [duration_text(s) for s in (0.02, 1.0, 1.5, 360.0, 3723.0)] == ["20ms", "1s", "1.5s", "6m0s", "1h2m3s"]


# ---- on a real gateway ----------------------------------------------------------------------------


async def add_key(gw: RunningGateway, acct: Account) -> str:
    async def add() -> str:
        _, key = await KeyStore(gw.services.store).add(acct)
        gw.services.accounts.forget()
        return key

    return await gw.call(add())


def speech(gw: RunningGateway, client: httpx.AsyncClient, key: str, text: str = "hello there"):
    return client.post(f"{gw.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm"})  # fmt: skip


async def test_concurrent_requests_racing_at_the_burst_let_exactly_the_burst_through(store_url: str) -> None:
    async with running_gateway({"store": {"url": store_url}}, backend=fake()) as gw:
        key = await add_key(gw, Account(name="racer", limits=Limits(rps=0.01, burst=5)))
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=30)) as client:
            replies = await asyncio.gather(*(speech(gw, client, key, f"text {i}") for i in range(24)))
            other = await client.get(f"{gw.url}/v1/audio/voices", headers={"Authorization": "Bearer nope"})
    codes = sorted(r.status_code for r in replies)
    assert codes == [200] * 5 + [429] * 19
    refused = next(r for r in replies if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.json()["error"]["type"] == "requests"
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "5"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    ok = next(r for r in replies if r.status_code == 200)
    assert ok.headers["x-ratelimit-limit-requests"] == "5"
    assert other.status_code == 401  # keys exist now: a made-up one is refused


async def test_concurrent_streams_racing_at_their_limit(store_url: str) -> None:
    async with running_gateway({"store": {"url": store_url}}, backend=slow()) as gw:
        key = await add_key(gw, Account(name="streamer", limits=Limits(max_streams=3)))
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=30)) as client:
            replies = await asyncio.gather(*(speech(gw, client, key, f"a longer text {i}") for i in range(10)))
            assert sorted(r.status_code for r in replies) == [200] * 3 + [429] * 7
            assert gw.services.limiter.in_flight(Account(name="streamer")) == 0  # all released
            again = await asyncio.gather(*(speech(gw, client, key, f"once more {i}") for i in range(3)))
    assert [r.status_code for r in again] == [200] * 3


async def test_the_openai_sdk_retries_a_rate_limit_after_retry_after_and_stops_at_a_quota() -> None:
    async with running_gateway(backend=fake()) as gw:
        key = await add_key(gw, Account(name="sdk", limits=Limits(rps=1.0, burst=1)))
        quota_key = await add_key(gw, Account(name="small", limits=Limits(quota_chars=12)))
        seen: list[int] = []

        async def note(response: httpx.Response) -> None:
            seen.append(response.status_code)

        http = httpx.AsyncClient(event_hooks={"response": [note]}, timeout=20)
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=2, http_client=http)
        await client.audio.speech.create(model="tts-1", voice="alloy", input="first")
        started = time.monotonic()
        second = await client.audio.speech.create(model="tts-1", voice="alloy", input="second")
        waited = time.monotonic() - started
        assert seen == [200, 429, 200]  # the SDK read the 429 and tried again, once
        assert second.content and waited >= 0.4  # after the bucket's refill (Retry-After), not at once

        seen.clear()
        small = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=quota_key, max_retries=3, http_client=http)
        await small.audio.speech.create(model="tts-1", voice="alloy", input="ten chars!")
        with pytest.raises(openai.RateLimitError) as refused:
            await small.audio.speech.create(model="tts-1", voice="alloy", input="ten more!!")
        assert refused.value.code == "insufficient_quota"
        assert seen == [200, 429]  # x-should-retry: false: waiting seconds does not help, no retry
        await http.aclose()


async def test_a_key_uses_and_adds_only_the_voices_it_is_given(tmp_path) -> None:
    from tests.api_helpers import CloningFakeBackend
    from tests.test_api_voices import upload

    backend = CloningFakeBackend(voices=("default", "bob"))
    async with running_gateway({"tts": {"voices_dir": str(tmp_path)}, "api": {"unknown_voice": "strict"}},
                               backend=backend) as gw, httpx.AsyncClient(timeout=30) as client:  # fmt: skip
        key = await add_key(gw, Account(name="narrow", voices=("default",), add_voices=("mine",)))
        auth = {"Authorization": f"Bearer {key}"}
        own = await client.post(f"{gw.url}/v1/audio/speech", headers=auth, json={"input": "hi", "voice": "default"})
        other = await client.post(f"{gw.url}/v1/audio/speech", headers=auth, json={"input": "hi", "voice": "bob"})
        theirs = await client.post(f"{gw.url}/v1/voices", headers=auth, **upload("alice"))
        mine = await client.post(f"{gw.url}/v1/voices", headers=auth, **upload("mine"))
        use_mine = await client.post(f"{gw.url}/v1/audio/speech", headers=auth, json={"input": "hi", "voice": "mine"})
    assert own.status_code == 200
    assert other.status_code == 403 and other.json()["error"]["code"] == "voice_not_allowed"
    assert theirs.status_code == 403 and mine.status_code in (200, 201)
    assert use_mine.status_code == 200  # a voice it may add, it may use
