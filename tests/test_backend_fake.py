"""FakeBackend on its own (no engine): length, chunking, determinism, failures, options."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tts_engine.backends import create_backend
from tts_engine.backends.fake import FakeBackend, FakeSynthesisError


def collect(backend: FakeBackend, text: str, voice: str = "default", speed: float = 1.0) -> list[np.ndarray]:
    stream = backend.open_stream(text, voice, speed)
    chunks = []
    while (chunk := stream.next_chunk()) is not None:
        chunks.append(chunk)
    stream.close()
    return chunks


def test_duration_follows_text_length_and_chunks_are_chunk_ms() -> None:
    backend = FakeBackend(16000, chunk_ms=100, ms_per_char=50.0)
    chunks = collect(backend, "abcdefghijk")  # 11 chars -> 550 ms -> 8800 samples
    assert sum(c.size for c in chunks) == 8800
    assert [c.size for c in chunks] == [1600] * 5 + [800]
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in chunks)


def test_empty_text_still_gives_one_character_of_audio() -> None:
    backend = FakeBackend(8000, ms_per_char=100.0)
    assert sum(c.size for c in collect(backend, "")) == 800


def test_tone_is_bounded_faded_and_audible() -> None:
    audio = np.concatenate(collect(FakeBackend(24000), "hello there"))
    assert np.max(np.abs(audio)) <= 0.3 + 1e-6
    assert abs(audio[0]) < 0.01 and abs(audio[-1]) < 0.01  # faded in and out: no click
    assert np.sqrt(np.mean(audio**2)) > 0.1


def test_output_is_deterministic_and_continuous_across_chunk_sizes() -> None:
    coarse = np.concatenate(collect(FakeBackend(24000, chunk_ms=200), "same text"))
    fine = np.concatenate(collect(FakeBackend(24000, chunk_ms=20), "same text"))
    np.testing.assert_allclose(coarse, fine, atol=1e-6)
    np.testing.assert_array_equal(
        coarse, np.concatenate(collect(FakeBackend(24000, chunk_ms=200), "same text"))
    )


def test_each_voice_has_its_own_pitch() -> None:
    backend = FakeBackend(16000, voices=("a", "b"))
    assert backend.voices() == ["a", "b"] and backend.default_voice == "a"

    def peak_hz(audio: np.ndarray) -> float:
        spectrum = np.abs(np.fft.rfft(audio))
        return float(np.fft.rfftfreq(audio.size, 1 / 16000)[np.argmax(spectrum)])

    pitch_a = peak_hz(np.concatenate(collect(backend, "x" * 20, "a")))
    pitch_b = peak_hz(np.concatenate(collect(backend, "x" * 20, "b")))
    assert abs(pitch_a - 220) < 2
    assert pitch_b > pitch_a + 3


def test_speed_shortens_the_audio() -> None:
    backend = FakeBackend(16000, ms_per_char=100.0)
    normal = sum(c.size for c in collect(backend, "abcd"))
    fast = sum(c.size for c in collect(backend, "abcd", speed=2.0))
    assert normal == 6400 and fast == 3200


def test_fail_on_raises_in_next_chunk_after_the_given_chunks() -> None:
    backend = FakeBackend(16000, chunk_ms=100, fail_on="BOOM", fail_after_chunks=2)
    assert len(collect(backend, "fine text")) > 0
    stream = backend.open_stream("this goes BOOM", "default", 1.0)  # opening is fine
    assert stream.next_chunk() is not None
    assert stream.next_chunk() is not None
    with pytest.raises(FakeSynthesisError):
        stream.next_chunk()


def test_default_step_catches_each_streams_error_separately() -> None:
    backend = FakeBackend(16000, fail_on="BOOM")
    good, bad = backend.open_stream("good", "default", 1.0), backend.open_stream("BOOM", "default", 1.0)
    results = backend.step([good, bad])
    assert isinstance(results[0], np.ndarray)
    assert isinstance(results[1], FakeSynthesisError)


def test_compute_delay_sleeps_per_chunk() -> None:
    backend = FakeBackend(16000, chunk_ms=100, ms_per_char=100.0, compute_delay_s=0.02)
    start = time.perf_counter()
    assert len(collect(backend, "abcde")) == 5
    assert time.perf_counter() - start >= 5 * 0.02


def test_counts_opened_and_closed_streams() -> None:
    backend = FakeBackend()
    stream = backend.open_stream("x", "default", 1.0)
    assert (backend.num_streams_opened, backend.num_streams_closed) == (1, 0)
    stream.close()
    stream.close()  # closing twice counts once
    assert (backend.num_streams_opened, backend.num_streams_closed) == (1, 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sample_rate": 0},
        {"chunk_ms": 0},
        {"ms_per_char": -1.0},
        {"compute_delay_s": -0.1},
        {"voices": ()},
        {"voices": "default"},
        {"fail_on": ""},
        {"fail_after_chunks": -1},
    ],
)
def test_bad_options_raise_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        FakeBackend(**kwargs)


def test_unknown_voice_and_bad_speed_raise_value_error() -> None:
    backend = FakeBackend()
    with pytest.raises(ValueError):
        backend.open_stream("x", "nobody", 1.0)
    with pytest.raises(ValueError):
        backend.open_stream("x", "default", 0.0)


def test_create_backend_builds_fake_with_options_and_rejects_unknown_names() -> None:
    backend = create_backend("fake", sample_rate=16000, chunk_ms=50)
    assert isinstance(backend, FakeBackend)
    assert (backend.name, backend.sample_rate, backend.chunk_ms) == ("fake", 16000, 50)
    with pytest.raises(ValueError, match="unknown TTS backend"):
        create_backend("nope")
