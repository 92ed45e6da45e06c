"""EspeakBackend on its own (no engine): real espeak-ng runs, voices, speed, failures, cleanup."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from tts_engine.backends import create_backend
from tts_engine.backends.espeak import EspeakBackend, EspeakError, decode_wav, resolve_voice
from tts_engine.errors import EngineError


@pytest.fixture(scope="module")
def backend() -> EspeakBackend:
    return EspeakBackend()


def collect(backend: EspeakBackend, text: str, voice: str = "default", speed: float = 1.0) -> np.ndarray:
    stream = backend.open_stream(text, voice, speed)
    try:
        chunks = []
        while (chunk := stream.next_chunk()) is not None:
            chunks.append(chunk)
    finally:
        stream.close()
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)


def write_script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_speaks_english_and_mandarin_with_real_energy(backend: EspeakBackend) -> None:
    assert backend.sample_rate == 22050
    for text in ("Hello, this is a test of the speech engine.", "你好，今天天气很好。"):
        audio = collect(backend, text)
        assert audio.dtype == np.float32 and audio.ndim == 1
        assert 0.8 < audio.size / backend.sample_rate < 10
        assert np.sqrt(np.mean(audio**2)) > 0.02
        assert np.max(np.abs(audio)) <= 1.0


def test_chunks_are_chunk_ms_long(backend: EspeakBackend) -> None:
    stream = backend.open_stream("One two three four five six seven.", "en", 1.0)
    sizes = []
    while (chunk := stream.next_chunk()) is not None:
        sizes.append(chunk.size)
    stream.close()
    assert len(sizes) > 2
    assert set(sizes[:-1]) == {round(0.2 * 22050)}
    assert 0 < sizes[-1] <= round(0.2 * 22050)


def test_voices_and_auto_selection(backend: EspeakBackend) -> None:
    assert backend.voices() == ["default", "zh", "en"]
    assert backend.default_voice == "default"
    assert resolve_voice("auto", "hello") == "en-us"
    assert resolve_voice("auto", "hello 世界") == "cmn"
    assert resolve_voice("cmn", "hello") == "cmn"
    assert backend.command_for("你好", "default", 1.0)[-4:-2] == ["-v", "cmn"]
    assert backend.command_for("hello", "default", 1.0)[-4:-2] == ["-v", "en-us"]
    assert backend.command_for("hello", "zh", 1.0)[-4:-2] == ["-v", "cmn"]


def test_speed_maps_to_words_per_minute_and_shortens_speech(backend: EspeakBackend) -> None:
    assert backend.wpm_for(1.0) == 175
    assert backend.wpm_for(2.0) == 350
    assert backend.wpm_for(0.25) == 80  # clamped to espeak-ng's minimum
    text = "The quick brown fox jumps over the lazy dog."
    assert collect(backend, text, "en", 2.0).size < 0.7 * collect(backend, text, "en", 1.0).size


def test_text_goes_through_stdin_so_dashes_are_spoken_not_parsed(backend: EspeakBackend) -> None:
    assert "--help" not in backend.command_for("--help", "en", 1.0)
    audio = collect(backend, "--help -v xx", "en")
    assert audio.size > 0.3 * backend.sample_rate


def test_streams_run_in_parallel_processes(backend: EspeakBackend) -> None:
    texts = [f"Sentence number {i} is being spoken right now." for i in range(4)]
    streams = [backend.open_stream(t, "en", 1.0) for t in texts]
    try:
        firsts = [s.next_chunk() for s in streams]
    finally:
        for s in streams:
            s.close()
    assert all(f is not None and f.size > 0 for f in firsts)


def test_custom_voice_map() -> None:
    custom = EspeakBackend(voices={"english": "en-us"}, rate_wpm=200)
    assert custom.voices() == ["english"] and custom.default_voice == "english"
    assert custom.command_for("hi", "english", 1.0)[-2:] == ["-s", "200"]


def test_missing_executable_is_a_clear_engine_error() -> None:
    with pytest.raises(EngineError, match="not found; install it with apt-get install espeak-ng"):
        EspeakBackend(executable="espeak-ng-does-not-exist")


def test_nonexistent_espeak_voice_fails_at_construction() -> None:
    with pytest.raises(EngineError, match="zzqx"):
        EspeakBackend(voices={"default": "zzqx"})


@pytest.mark.parametrize("kwargs", [{"rate_wpm": 10}, {"timeout_s": 0}, {"chunk_ms": 0}, {"voices": {}}])
def test_bad_options_raise_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        EspeakBackend(**kwargs)


def test_timeout_kills_the_process(tmp_path: Path) -> None:
    slow = EspeakBackend(timeout_s=0.3)
    slow.executable = write_script(tmp_path / "slow-espeak", "exec sleep 30")
    stream = slow.open_stream("hello", "en", 1.0)
    start = time.monotonic()
    with pytest.raises(EspeakError, match="did not finish"):
        stream.next_chunk()
    assert time.monotonic() - start < 3
    stream.close()


def test_failing_process_reports_its_status_and_message(tmp_path: Path) -> None:
    broken = EspeakBackend()
    broken.executable = write_script(tmp_path / "broken-espeak", "echo 'voice exploded' >&2; exit 3")
    stream = broken.open_stream("hello", "en", 1.0)
    with pytest.raises(EspeakError, match=r"status 3: voice exploded"):
        stream.next_chunk()
    stream.close()


def test_close_before_reading_kills_the_process(tmp_path: Path) -> None:
    slow = EspeakBackend()
    pid_file = tmp_path / "pid"
    slow.executable = write_script(tmp_path / "slow-espeak", f"echo $$ > {pid_file}; exec sleep 30")
    stream = slow.open_stream("hello", "en", 1.0)
    stream.start()  # open_stream() only records the request; the process starts here or in step()
    deadline = time.monotonic() + 5
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.01)
    pid = int(pid_file.read_text())
    stream.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: the process is gone


def test_decode_wav_handles_empty_and_rejects_garbage() -> None:
    audio, rate = decode_wav(b"")
    assert audio.size == 0 and rate == 0
    with pytest.raises(EspeakError):
        decode_wav(b"definitely not a wav file at all")


def test_create_backend_builds_espeak() -> None:
    backend = create_backend("espeak", rate_wpm=150)
    assert isinstance(backend, EspeakBackend) and backend.name == "espeak" and backend.rate_wpm == 150
