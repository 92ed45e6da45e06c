"""The exact audio cache (gateway/service/cache): a repeat is byte-identical and never reaches the engine,
what is part of the key makes another entry, a replaced voice drops its entries, the memory tier keeps to
its budget, and the disk tier never serves a torn entry: a writer killed with SIGKILL in the middle of an
entry leaves nothing that is read, and a file damaged afterwards is dropped, not served."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np

from gateway.service.cache.disk import DiskTier
from gateway.service.cache.entry import CachedAudio
from gateway.service.cache.memory import MemoryTier
from tests import cache_writer
from tests.api_helpers import fake
from tests.gateway_server import running_gateway

ROOT = Path(__file__).resolve().parent.parent


def body(text: str, **kw) -> dict:
    return {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "wav", **kw}


async def test_a_repeat_is_byte_identical_and_never_reaches_the_engine(tmp_path: Path) -> None:
    backend = fake()
    async with running_gateway({"cache": {"dir": str(tmp_path / "cache")}}, backend=backend) as gw:
        async with httpx.AsyncClient(timeout=30) as client:
            url = f"{gw.url}/v1/audio/speech"
            opened = backend.num_streams_opened
            first = await client.post(url, json=body("The same sentence, again and again."))
            second = await client.post(url, json=body("  The same   sentence, again and again. "))
            assert backend.num_streams_opened == opened + 1  # whitespace is not part of the key
            faster = await client.post(url, json=body("The same sentence, again and again.", speed=1.5))
            mp3 = await client.post(url, json=body("The same sentence, again and again.", response_format="mp3"))
            mp3_again = await client.post(url, json=body("The same sentence, again and again.", response_format="mp3"))
            assert backend.num_streams_opened == opened + 2  # speed is; the output format is not (encoded from PCM)
            stats = gw.services.cache.stats()
    assert first.status_code == second.status_code == faster.status_code == 200
    assert first.headers["x-cache"] == "miss" and second.headers["x-cache"] == "hit"
    assert first.content == second.content
    assert faster.headers["x-cache"] == "miss" and faster.content != first.content
    assert mp3.headers["x-cache"] == "hit" and mp3.content == mp3_again.content
    assert stats["hits_memory"] >= 3 and stats["misses"] >= 2


async def test_a_disk_entry_outlives_a_restart_and_a_replaced_voice_drops_its_entries(tmp_path: Path) -> None:
    config = {"cache": {"dir": str(tmp_path / "cache")}}
    text = "Kept on disk for the next run."
    async with running_gateway(config, backend=fake()) as gw, httpx.AsyncClient(timeout=30) as client:
        first = await client.post(f"{gw.url}/v1/audio/speech", json=body(text))
        await gw.call(gw.services.cache.aclose())  # the disk writer's queue is written out
    backend = fake()
    async with running_gateway(config, backend=backend) as gw, httpx.AsyncClient(timeout=30) as client:
        opened = backend.num_streams_opened
        assert opened == 0  # the fixed phrases came from the folder too
        disk_hits = gw.services.cache.stats()["hits_disk"]
        again = await client.post(f"{gw.url}/v1/audio/speech", json=body(text))
        assert backend.num_streams_opened == opened and again.content == first.content
        assert gw.services.cache.stats()["hits_disk"] == disk_hits + 1
        await gw.call(gw.services.cache.invalidate_voice("default"))  # "alloy" is the fake's "default"
        fresh = await client.post(f"{gw.url}/v1/audio/speech", json=body(text))
        assert backend.num_streams_opened == opened + 1 and fresh.headers["x-cache"] == "miss"


def test_the_memory_tier_keeps_to_its_budget_and_never_drops_a_pinned_entry() -> None:
    def entry(name: str, samples: int) -> CachedAudio:
        return CachedAudio.of(name, "v", 24000, [np.ones(samples, np.int16)])

    tier = MemoryTier(budget_bytes=10_000)
    tier.pin(entry("phrase", 8_000))
    for i in range(6):
        tier.put(entry(f"e{i}", 1_000))  # 2 KB each
    assert tier.lru_bytes <= 10_000 and tier.evictions == 1 and tier.get("e0") is None
    assert tier.get("phrase") is not None and tier.get("e5") is not None
    tier.get("e1")  # used: the next eviction takes e2
    tier.put(entry("e6", 1_000))
    assert tier.get("e1") is not None and tier.get("e2") is None
    assert tier.drop_voice("v") == 5 and tier.get("phrase") is not None


def test_a_writer_killed_mid_entry_leaves_nothing_that_is_served(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.cache_writer", str(folder), "3"], cwd=ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        lines = []
        while not lines or not lines[-1].startswith("mid"):
            line = proc.stdout.readline()
            assert line, f"the writer ended early: {lines}"
            lines.append(line.strip())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert lines == ["wrote 0", "wrote 1", "wrote 2", "mid 3"]
    torn = list(folder.glob("*/.*.tmp"))
    assert len(torn) == 1 and 0 < torn[0].stat().st_size < cache_writer.SAMPLES * 2  # half written

    tier = DiskTier(folder, 1 << 30)
    tier.scan()
    assert len(tier) == 3 and cache_writer.key_of(3) not in tier
    assert tier.read(cache_writer.key_of(3)) is None
    for k in range(3):
        got = tier.read(cache_writer.key_of(k))
        assert got is not None and np.array_equal(got.pcm, cache_writer.entry(k).pcm)
        assert got.chunks == cache_writer.entry(k).chunks

    # a whole file damaged later (a disk that lost writes): checked on read, dropped, never served
    victim = next(folder.glob(f"*/{cache_writer.key_of(1)}.xzc"))
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 1000])
    flipped = next(folder.glob(f"*/{cache_writer.key_of(2)}.xzc"))
    raw = bytearray(flipped.read_bytes())
    raw[-5] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    again = DiskTier(folder, 1 << 30)
    again.scan()
    assert again.read(cache_writer.key_of(1)) is None and again.read(cache_writer.key_of(2)) is None
    assert again.torn == 2 and not victim.exists() and not flipped.exists()
    assert again.read(cache_writer.key_of(0)) is not None


async def test_concurrent_identical_requests_all_get_the_same_audio(tmp_path: Path) -> None:
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient(timeout=30) as client:
        url = f"{gw.url}/v1/audio/speech"
        first = await client.post(url, json=body("Many ask for this at once."))
        replies = await asyncio.gather(*(client.post(url, json=body("Many ask for this at once.")) for _ in range(8)))
    assert all(r.headers["x-cache"] == "hit" and r.content == first.content for r in replies)


async def test_zero_shot_answers_are_cached_under_their_prompt(tmp_path: Path) -> None:
    from tests.api_helpers import CloningFakeBackend, prompt_wav

    backend = CloningFakeBackend()
    files = {"prompt_wav": ("p.wav", prompt_wav(), "audio/wav")}
    config = {"tts": {"voices_dir": str(tmp_path)}}
    async with running_gateway(config, backend=backend) as gw, httpx.AsyncClient(timeout=30) as client:
        url = f"{gw.url}/tts/zero_shot"
        first = await client.post(url, data={"text": "Cloned words.", "prompt_text": "你好"}, files=files)
        again = await client.post(url, data={"text": "Cloned words.", "prompt_text": "你好"}, files=files)
        other = await client.post(url, data={"text": "Cloned words.", "prompt_text": "再见"}, files=files)
    assert first.status_code == again.status_code == other.status_code == 200
    assert again.content == first.content and again.headers["x-cache"] == "hit"
    assert other.headers["x-cache"] == "miss"  # another prompt is another voice
    assert len(backend.zero_shot_prompts) == 2


async def test_the_fixed_phrases_keep_their_audio_until_the_new_is_ready(monkeypatch) -> None:
    import gateway.speech.phrases as phrases_module
    from gateway.config import CacheConfig
    from gateway.service.cache import AudioCache
    from gateway.speech.phrases import Phrases
    from tests.turn_fakes import RATE, FakeEngine

    apology = "Sorry, I could not answer that."
    revision = {"now": "r1"}  # the voice's version (a preset replaced through /v1/voices changes it)
    monkeypatch.setattr(phrases_module, "voice_revision", lambda voices, name: revision["now"])
    cache = AudioCache(CacheConfig())
    phrases = Phrases([apology], output_rate=RATE, voice="default", cache=cache)
    await phrases.prepare(FakeEngine())
    (old_key,) = [e.key for e in phrases._audio.values()]
    assert cache.peek(old_key) is not None  # pinned in the cache, where the API finds it too

    revision["now"] = "r2"
    stuck = FakeEngine(hang=(apology,))  # the new version cannot be made yet
    refresh = asyncio.create_task(phrases.prepare(stuck, timeout_s=0.3))
    await asyncio.sleep(0.05)
    assert phrases.stream(apology, None) is not None and phrases.any_voice(apology) is not None
    await refresh
    assert phrases.stream(apology, None) is not None  # the new one failed: the old plays on
    assert phrases.status()["missing"] == []

    await phrases.prepare(FakeEngine())  # tried again, made
    (new_key,) = [e.key for e in phrases._audio.values()]
    assert new_key != old_key and cache.peek(new_key) is not None
    assert cache.peek(old_key) is None  # the old version is no longer pinned (nor kept)
