"""Many espeak-ng requests at once: audio that is ready never waits behind synthesis still running.

The burst failure (issue 12, item 15): the engine's step asked each stream for its next chunk in turn,
and an espeak-ng stream whose process had not finished blocked the whole step, so devices already
playing were starved by other devices' first sentences (gaps of up to 1.4 s, underruns). These tests
make one request's synthesis deliberately slow (a wrapper that sleeps before running espeak-ng), so the
old behaviour fails by seconds, not by milliseconds: they are not sensitive to machine load.
"""

from __future__ import annotations

import asyncio
import shutil
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from gateway.llm.echo import EchoLLM
from scripts.bench_gateway import device_underruns
from scripts.device_sim import DeviceSimulator
from tests.gateway_server import running_gateway
from tts_engine.backends.espeak import EspeakBackend, EspeakStream

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")

SLOW_S = 3.0  # synthesis time of a "slow" request: 50 frame periods
SLOW_WORD = "Slowly"


def slow_espeak(tmp_path: Path) -> str:
    """espeak-ng behind a wrapper that first sleeps SLOW_S when the text holds SLOW_WORD."""
    script = tmp_path / "espeak-ng-slow"
    real = shutil.which("espeak-ng")
    script.write_text(
        "#!/bin/sh\n"
        'text=$(cat)\n'
        f'case "$text" in *{SLOW_WORD}*) sleep {SLOW_S};; esac\n'
        f'printf %s "$text" | exec {real} "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_step_serves_ready_audio_while_another_stream_synthesises(tmp_path: Path) -> None:
    backend = EspeakBackend(executable=slow_espeak(tmp_path), timeout_s=30)
    slow = backend.open_stream(f"{SLOW_WORD} spoken words.", "en", 1.0)
    fast = backend.open_stream("Hello there, this sentence is ready at once.", "en", 1.0)
    try:
        t0 = time.monotonic()
        # the slow stream is ranked first, as a first sentence (no slack) is ahead of a playing one
        results = []
        while not any(isinstance(r, np.ndarray) and r.size for r in results[1:2]):
            results = backend.step([slow, fast])
        elapsed = time.monotonic() - t0
        assert elapsed < SLOW_S / 2, f"the ready stream waited {elapsed:.2f} s for the slow one"
        assert isinstance(results[0], np.ndarray) and results[0].size == 0  # nothing yet, no error
        chunks = [results[1]]
        while time.monotonic() - t0 < SLOW_S / 2:  # the fast stream runs to its end meanwhile
            out = backend.step([slow, fast])
            if out[1] is None:
                break
            chunks.append(out[1])
        assert out[1] is None and time.monotonic() - t0 < SLOW_S / 2
        assert sum(c.size for c in chunks) > 0.5 * backend.sample_rate
        # with nothing else to do, the step waits for the slow process (no busy loop) and gets its audio
        out = backend.step([slow])
        assert isinstance(out[0], np.ndarray) and out[0].size > 0
        assert time.monotonic() - t0 >= SLOW_S
    finally:
        slow.close()
        fast.close()


def test_processes_start_in_rank_order_and_at_most_max_processes_at_once(tmp_path: Path) -> None:
    backend = EspeakBackend(executable=slow_espeak(tmp_path), timeout_s=30, max_processes=2)
    streams = [backend.open_stream(f"{SLOW_WORD} number {i}.", "en", 1.0) for i in range(4)]
    ready = backend.open_stream("Ready soon.", "en", 1.0)
    try:
        ranked: list[EspeakStream] = [ready, *streams]
        out = []
        while not (isinstance(out[:1] and out[0], np.ndarray) and out[0].size):
            out = backend.step(ranked)
        assert [s.started for s in ranked] == [True, True, True, False, False]
        assert sum(s.running for s in ranked) <= 2
    finally:
        for s in [ready, *streams]:
            s.close()


async def test_a_device_playing_is_not_starved_by_another_devices_slow_synthesis(tmp_path: Path) -> None:
    """Two devices over loopback: one reply needs SLOW_S of synthesis; the other plays without a gap."""
    backend = EspeakBackend(executable=slow_espeak(tmp_path), timeout_s=30)
    llm = EchoLLM(chinese_prefix="", prefix="")
    async with running_gateway({"audio": {"output_sample_rate": 16000}}, backend=backend, llm=llm) as gw:
        playing = DeviceSimulator(gw.url, device_id="aa:bb:cc:00:01:01", decode=False)
        blocked = DeviceSimulator(gw.url, device_id="aa:bb:cc:00:01:02", decode=False)
        await playing.connect()
        await blocked.connect()
        try:
            await playing.listen_start("auto")
            await blocked.listen_start("auto")
            text = "This is a long enough reply that plays for several seconds on the device, without a gap."
            ask = asyncio.create_task(playing.ask(text, timeout=60))
            await asyncio.sleep(0.3)  # the first device has started playing
            other = asyncio.create_task(blocked.ask(f"{SLOW_WORD} spoken reply.", timeout=60))
            async with asyncio.timeout(60):
                turn, slow_turn = await asyncio.gather(ask, other)
        finally:
            await playing.close()
            await blocked.close()
    assert len(turn.frames) > 30 and slow_turn.frames
    late = [(i, round(g, 3)) for i, g in enumerate(turn.gaps) if g > 0.065]
    assert device_underruns(turn) == 0, f"late frames (index, gap s): {late}"
    steady = turn.gaps[5:]
    assert max(steady) < 0.5, f"a gap of {max(steady):.2f} s while another device's text synthesised"
