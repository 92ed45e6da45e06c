"""Batched post-processing of a step's audio equals the per-stream path, chunk by chunk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tts_engine.postprocess import int16_on_device, postprocess_chunks
from tts_engine.request import ChunkCredit, EngineRequest
from tts_engine.resample import StreamingResampler, process_batch

RATES = (8000, 16000, 22050, 24000, 44100, 48000)


def random_chunks(seed: int, num_streams: int, num_steps: int) -> list[list[torch.Tensor]]:
    """Per step, one chunk per stream with its own random length (sometimes empty)."""
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(num_steps):
        lengths = torch.randint(0, 3000, (num_streams,), generator=gen).tolist()
        steps.append([torch.rand(n, generator=gen) * 1.8 - 0.9 for n in lengths])
    return steps


def test_process_batch_equals_each_streaming_resampler() -> None:
    rates = [RATES[i % len(RATES)] for i in range(9)]  # several rows share a rate pair, one is identity
    solo = [StreamingResampler(24000, r) for r in rates]
    batched = [StreamingResampler(24000, r) for r in rates]
    for chunks in random_chunks(0, len(rates), 6):
        expected = [r.process(c) for r, c in zip(solo, chunks, strict=True)]
        got = process_batch(batched, chunks)
        for e, g in zip(expected, got, strict=True):
            assert g.shape == e.shape
            torch.testing.assert_close(g, e, atol=1e-6, rtol=0)
    for s, b in zip(solo, batched, strict=True):  # the state stayed in step: the tails agree too
        torch.testing.assert_close(b.flush(), s.flush(), atol=1e-6, rtol=0)


def test_process_batch_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="resamplers"):
        process_batch([StreamingResampler(24000, 16000)], [])
    with pytest.raises(TypeError, match="1-D"):
        process_batch([StreamingResampler(24000, 16000)], [torch.zeros(2, 2)])


def test_int16_on_device_matches_the_host_conversion() -> None:
    audio = torch.tensor([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -2.0, float("nan"), float("inf"), -float("inf")])
    audio = torch.cat([audio, torch.rand(1000) * 2 - 1, torch.tensor([0.5 / 32767, 1.5 / 32767])])
    samples = np.nan_to_num(audio.numpy(), nan=0.0, posinf=1.0, neginf=-1.0)
    expected = np.clip(np.rint(samples * 32767.0), -32768, 32767).astype(np.int16)
    got = int16_on_device(audio)
    assert got.dtype == torch.int16
    np.testing.assert_array_equal(got.numpy(), expected)


def make_request(req_id: str, rate: int) -> EngineRequest:
    request = EngineRequest(
        req_id=req_id, text="x", voice="v", speed=1.0, output_rate=rate,
        stream=None, credit=ChunkCredit(),  # type: ignore[arg-type]
    )  # fmt: skip
    request.resampler = StreamingResampler(24000, rate)
    return request


def test_postprocess_chunks_equals_per_request_to_pcm() -> None:
    rates = [16000, 16000, 24000, 48000, 8000]
    solo = [make_request(f"s{i}", r) for i, r in enumerate(rates)]
    batched = [make_request(f"b{i}", r) for i, r in enumerate(rates)]
    for chunks in random_chunks(1, len(rates), 5):
        expected = [r.to_pcm(c.numpy()) for r, c in zip(solo, chunks, strict=True)]
        got = postprocess_chunks([(r, c) for r, c in zip(batched, chunks, strict=True)])
        for e, g in zip(expected, got, strict=True):
            assert isinstance(g, np.ndarray) and g.dtype == np.int16
            assert g.shape == e.shape
            assert np.abs(g.astype(np.int32) - e.astype(np.int32)).max(initial=0) <= 1  # float rounding


def test_a_bad_chunk_fails_only_its_own_row() -> None:
    good, bad = make_request("good", 16000), make_request("bad", 16000)
    chunk = torch.rand(2400) - 0.5
    reference = make_request("ref", 16000).to_pcm(chunk)
    out = postprocess_chunks([(bad, np.zeros(5, np.int32)), (good, chunk)])
    assert isinstance(out[0], Exception)
    np.testing.assert_array_equal(out[1], reference)
