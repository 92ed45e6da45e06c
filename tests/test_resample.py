import math

import pytest
import torch

from tts_engine.resample import StreamingResampler, output_length, resample

RATE_PAIRS = [(24000, 16000), (22050, 16000), (22050, 24000), (16000, 24000), (24000, 24000)]


def tone(freq: float, sample_rate: int, seconds: float = 0.5, phase: float = 0.3) -> torch.Tensor:
    t = torch.arange(int(sample_rate * seconds), dtype=torch.float64) / sample_rate
    return torch.sin(2 * math.pi * freq * t + phase)


def stream(resampler: StreamingResampler, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    pieces, pos = [], 0
    for size in sizes:
        pieces.append(resampler.process(x[pos : pos + size]))
        pos += size
    assert pos >= x.shape[0]
    pieces.append(resampler.flush())
    return torch.cat(pieces)


def random_sizes(total: int, seed: int, max_size: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    sizes = []
    while sum(sizes) < total:
        sizes.append(int(torch.randint(0, max_size + 1, (1,), generator=gen)))  # includes empty chunks
    return sizes


def peak_rms_db(y: torch.Tensor) -> float:
    """Level of a steady tone relative to a full-scale sine, ignoring the edges."""
    middle = y[y.shape[0] // 10 : -y.shape[0] // 10]
    return 20 * math.log10(middle.pow(2).mean().sqrt().item() * math.sqrt(2) + 1e-12)


@pytest.mark.parametrize(("orig_sr", "new_sr"), RATE_PAIRS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_equals_offline_for_random_splits(orig_sr: int, new_sr: int, seed: int) -> None:
    x = torch.randn(4000, generator=torch.Generator().manual_seed(100 + seed))
    expected = resample(x, orig_sr, new_sr)
    got = stream(StreamingResampler(orig_sr, new_sr), x, random_sizes(x.shape[0], seed, max_size=700))
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-6)  # float rounding only


@pytest.mark.parametrize(("orig_sr", "new_sr"), RATE_PAIRS)
def test_streaming_one_sample_chunks_with_empty_chunks(orig_sr: int, new_sr: int) -> None:
    x = torch.randn(500, generator=torch.Generator().manual_seed(7))
    sizes = [1, 0] * x.shape[0]
    got = stream(StreamingResampler(orig_sr, new_sr), x, sizes)
    torch.testing.assert_close(got, resample(x, orig_sr, new_sr), atol=2e-6, rtol=1e-6)  # float rounding only


@pytest.mark.parametrize(("orig_sr", "new_sr"), RATE_PAIRS)
@pytest.mark.parametrize("num_input", [0, 1, 2, 3, 147, 441, 1000])
def test_output_length_is_ceil(orig_sr: int, new_sr: int, num_input: int) -> None:
    expected = math.ceil(num_input * new_sr / orig_sr)
    assert output_length(num_input, orig_sr, new_sr) == expected
    assert resample(torch.randn(num_input), orig_sr, new_sr).shape == (expected,)
    got = stream(StreamingResampler(orig_sr, new_sr), torch.randn(num_input), [num_input])
    assert got.shape == (expected,)


def test_process_emits_output_within_filter_lookahead() -> None:
    resampler = StreamingResampler(24000, 16000)
    assert 0 < resampler.lookahead < 100  # a few milliseconds at 24 kHz
    emitted = 0
    for fed in range(480, 24000, 480):
        emitted += resampler.process(torch.randn(480)).shape[0]
        assert output_length(fed - resampler.lookahead, 24000, 16000) - 1 <= emitted
        assert emitted <= output_length(fed, 24000, 16000)


def test_one_khz_sine_keeps_frequency_and_amplitude() -> None:
    y = resample(0.5 * tone(1000, 24000, seconds=1.0), 24000, 16000)
    assert y.shape == (16000,)
    spectrum = torch.fft.rfft(y[2000:14000] * torch.hann_window(12000, dtype=torch.float64))
    peak_hz = int(spectrum.abs().argmax()) * 16000 / 12000
    assert abs(peak_hz - 1000) <= 16000 / 12000
    middle = y[1000:-1000]  # a whole number of periods
    amplitude = middle.pow(2).mean().sqrt().item() * math.sqrt(2)
    assert abs(amplitude - 0.5) < 0.005


@pytest.mark.parametrize(("orig_sr", "new_sr"), [(24000, 16000), (22050, 16000)])
def test_tone_above_cutoff_is_attenuated(orig_sr: int, new_sr: int) -> None:
    assert peak_rms_db(resample(tone(7900, orig_sr), orig_sr, new_sr)) < -40
    # 9 kHz is above the 8 kHz output Nyquist: it would alias to about 7 kHz
    assert peak_rms_db(resample(tone(9000, orig_sr), orig_sr, new_sr)) < -60


@pytest.mark.parametrize(("orig_sr", "new_sr"), RATE_PAIRS)
def test_passband_tone_is_kept(orig_sr: int, new_sr: int) -> None:
    assert abs(peak_rms_db(resample(tone(5000, orig_sr), orig_sr, new_sr))) < 0.05


@pytest.mark.parametrize(("orig_sr", "new_sr"), RATE_PAIRS)
def test_output_is_aligned_with_input_time(orig_sr: int, new_sr: int) -> None:
    # no group delay: resampling a sine gives the same sine sampled at the new rate
    y = resample(tone(1000, orig_sr), orig_sr, new_sr)
    reference = tone(1000, new_sr)[: y.shape[0]]
    edge = new_sr // 50
    assert (y - reference)[edge:-edge].abs().max().item() < 1e-3


def test_impulse_peak_lands_on_the_matching_output_sample() -> None:
    x = torch.zeros(2000, dtype=torch.float64)
    x[882] = 1.0  # 40 ms at 22050 Hz
    y = resample(x, 22050, 16000)
    assert int(y.argmax()) == 640  # 40 ms at 16 kHz


def test_identity_passes_through() -> None:
    x = torch.randn(1234)
    assert torch.equal(resample(x, 24000, 24000), x)
    resampler = StreamingResampler(24000, 24000)
    assert torch.equal(resampler.process(x[:100]), x[:100])
    assert torch.equal(resampler.process(x[100:]), x[100:])
    assert resampler.flush().shape == (0,)


def test_batched_offline_matches_rows() -> None:
    x = torch.randn(3, 1500)
    y = resample(x, 22050, 16000)
    assert y.shape == (3, output_length(1500, 22050, 16000))
    for row in range(3):
        torch.testing.assert_close(
            y[row], resample(x[row], 22050, 16000), atol=2e-6, rtol=1e-6
        )  # float rounding only


def test_flush_and_reset_start_a_new_stream() -> None:
    a, b = torch.randn(900), torch.randn(700)
    resampler = StreamingResampler(24000, 16000)
    stream(resampler, a, [300, 300, 300])
    torch.testing.assert_close(
        stream(resampler, b, [350, 350]), resample(b, 24000, 16000), atol=2e-6, rtol=1e-6
    )  # float rounding only
    resampler.process(a)
    resampler.reset()
    torch.testing.assert_close(
        stream(resampler, b, [700]), resample(b, 24000, 16000), atol=2e-6, rtol=1e-6
    )  # float rounding only


def test_dtype_and_device_follow_the_resampler() -> None:
    resampler = StreamingResampler(24000, 16000, dtype=torch.float64)
    out = resampler.process(torch.randn(2400, dtype=torch.float32))
    assert out.dtype == torch.float64 and out.device.type == "cpu"
    assert resample(torch.randn(100, dtype=torch.float64), 16000, 24000).dtype == torch.float64


@pytest.mark.parametrize("bad", [0, -16000, 16000.0, True])
def test_bad_rates_raise_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="orig_sr"):
        StreamingResampler(bad, 16000)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="new_sr"):
        resample(torch.zeros(10), 16000, bad)  # type: ignore[arg-type]


def test_rate_pair_with_too_many_phases_is_rejected() -> None:
    with pytest.raises(ValueError, match="phases"):
        StreamingResampler(48000, 44117)


def test_bad_input_tensors_raise_type_error() -> None:
    resampler = StreamingResampler(24000, 16000)
    with pytest.raises(TypeError):
        resampler.process(torch.zeros(2, 10))
    with pytest.raises(TypeError):
        resampler.process(torch.zeros(10, dtype=torch.int16))
    with pytest.raises(TypeError):
        resampler.process([0.0, 1.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        resample(torch.zeros(10, dtype=torch.int64), 24000, 16000)
    with pytest.raises(TypeError):
        StreamingResampler(24000, 16000, dtype=torch.int16)
