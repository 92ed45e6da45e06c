"""The gpu-sim benchmark backend: a step's cost and its GIL shape, its audio, batching in the engine, options."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from gateway.config import TTSConfig
from gateway.tts_choice import create_tts_backend
from tts_engine import TTSEngine
from tts_engine.backends import create_backend
from tts_engine.backends.fake import FakeBackend
from tts_engine.backends.gpu_sim import GpuSimBackend


def open_streams(backend: GpuSimBackend, n: int, text: str = "hello there") -> list:
    return [backend.open_stream(text, "default", 1.0) for _ in range(n)]


def test_a_step_costs_python_plus_gpu_time_whatever_the_batch_size() -> None:
    backend = GpuSimBackend(step_ms=40, python_ms=20)
    durations = {}
    for n in (1, 32):
        streams = open_streams(backend, n)
        start = time.perf_counter()
        results = backend.step(streams)
        durations[n] = time.perf_counter() - start
        assert len(results) == n and all(isinstance(r, np.ndarray) for r in results)
    assert durations[1] >= 0.060 and durations[32] >= 0.060
    assert durations[32] < 3 * durations[1]  # a batch costs about one step, not one per stream
    assert (backend.num_steps, backend.num_step_streams) == (2, 33)
    assert backend.step_stats() == {"gpu_sim_steps": 2, "gpu_sim_step_streams": 33}


def test_an_empty_step_costs_nothing() -> None:
    backend = GpuSimBackend(step_ms=500, python_ms=500)
    start = time.perf_counter()
    assert backend.step([]) == []
    assert time.perf_counter() - start < 0.2
    assert backend.num_steps == 0


def _other_thread_progress_during_a_step(backend: GpuSimBackend) -> int:
    """Loops an I/O-like thread completes while ``backend.step()`` runs in this one: each loop gives the
    GIL up (a zero sleep, as the gateway's event loop does at every socket call) and must get it back."""
    count = 0
    stop = threading.Event()
    started = threading.Event()

    def spin() -> None:
        nonlocal count
        started.set()
        while not stop.is_set():
            time.sleep(0)
            count += 1

    thread = threading.Thread(target=spin)
    thread.start()
    started.wait()
    try:
        backend.step(open_streams(backend, 4))
    finally:
        stop.set()
        thread.join()
    return count


def test_the_gpu_wait_releases_the_gil_and_the_python_part_holds_it() -> None:
    # Same step length, one all "GPU" (sleep), one all Python: while the step sleeps the other thread
    # has the interpreter to itself; while it runs Python, every GIL hand-back waits for the switch
    # interval (5 ms). Measured 10-60x apart on a loaded 2-core machine.
    gpu_bound = _other_thread_progress_during_a_step(GpuSimBackend(step_ms=300, python_ms=0))
    python_bound = _other_thread_progress_during_a_step(GpuSimBackend(step_ms=0, python_ms=300))
    assert gpu_bound > 3 * python_bound, (gpu_bound, python_bound)


def run_to_end(backend: GpuSimBackend, text: str) -> list[np.ndarray]:
    """What one stream's steps return, in order, until it is done."""
    (stream,) = open_streams(backend, 1, text)
    results = []
    while (result := backend.step([stream])[0]) is not None:
        assert isinstance(result, np.ndarray)
        results.append(result)
    return results


def fake_tone(text: str) -> np.ndarray:
    fake = FakeBackend(16000, chunk_ms=40, ms_per_char=50.0).open_stream(text, "default", 1.0)
    chunks = []
    while (chunk := fake.next_chunk()) is not None:
        chunks.append(chunk)
    return np.concatenate(chunks)


def test_audio_is_the_fake_tone_advanced_chunk_ms_a_step() -> None:
    backend = GpuSimBackend(16000, step_ms=0, python_ms=0, chunk_ms=40, hop_chunks=1, ms_per_char=50.0)
    results = run_to_end(backend, "abcdefghijk")  # 11 chars -> 550 ms -> 8800 samples
    assert [r.size for r in results] == [640] * 13 + [480]
    np.testing.assert_array_equal(np.concatenate(results), fake_tone("abcdefghijk"))


def test_audio_leaves_in_hops_with_empty_chunks_between() -> None:
    backend = GpuSimBackend(16000, step_ms=0, python_ms=0, chunk_ms=40, hop_chunks=5, ms_per_char=50.0)
    # 14 tokens (13 x 640 samples + 480): hops after steps 5 and 10, the last 4 tokens once the text ends
    results = run_to_end(backend, "abcdefghijk")
    assert [r.size for r in results] == [0, 0, 0, 0, 3200] * 2 + [0, 0, 0, 0, 3 * 640 + 480]
    np.testing.assert_array_equal(np.concatenate(results), fake_tone("abcdefghijk"))


def test_fail_on_fails_only_that_stream() -> None:
    backend = GpuSimBackend(step_ms=0, python_ms=0, fail_on="BOOM")
    good, bad = backend.open_stream("good", "default", 1.0), backend.open_stream("BOOM", "default", 1.0)
    results = backend.step([good, bad])
    assert isinstance(results[0], np.ndarray) and isinstance(results[1], Exception)


async def test_concurrent_requests_share_engine_steps() -> None:
    backend = GpuSimBackend(step_ms=5, python_ms=1, chunk_ms=40, max_batch_size=16)
    engine = TTSEngine(backend, max_buffered_chunks=64)
    await engine.start()
    try:
        streams = [engine.synthesize("twelve chars", output_rate=16000) for _ in range(8)]

        async def read_all(stream) -> int:
            return sum([chunk.size async for chunk in stream])

        sizes = await asyncio.wait_for(asyncio.gather(*(read_all(s) for s in streams)), 30)
        stats = engine.stats
    finally:
        await engine.close()
    assert sizes == [round(12 * 80 * 16)] * 8  # 12 chars x 80 ms at 16 kHz each
    assert stats["max_batch_size_seen"] >= 2
    assert backend.num_step_streams > 2 * backend.num_steps  # most steps carried several streams


@pytest.mark.parametrize(
    "kwargs",
    [{"step_ms": -1}, {"python_ms": -0.5}, {"max_batch_size": 0}, {"chunk_ms": 0}, {"hop_chunks": 0}],
)
def test_bad_options_raise_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        GpuSimBackend(**kwargs)


def test_built_by_name_and_from_the_tts_config_section() -> None:
    assert isinstance(create_backend("gpu-sim"), GpuSimBackend)
    cfg = TTSConfig(backend="gpu-sim", gpu_sim={"step_ms": 7, "python_ms": 3, "chunk_ms": 60})
    backend = create_tts_backend("gpu-sim", cfg)
    assert isinstance(backend, GpuSimBackend) and backend.name == "gpu-sim"
    assert (backend.step_ms, backend.python_ms, backend.chunk_ms, backend.max_batch_size) == (7, 3, 60, 128)
