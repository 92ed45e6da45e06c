import math

import pytest
import torch

from cosyvoice.frontend.features import (
    FeatureError,
    campplus_fbank,
    flow_mel,
    kaldi_fbank,
    slaney_mel_filterbank,
    whisper_log_mel,
)
from cosyvoice.frontend.resample import ResampleError, resample


def noise(*shape: int, scale: float) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(1234))


def tone(freq: float, sample_rate: int, seconds: float, amplitude: float = 0.5) -> torch.Tensor:
    t = torch.arange(int(sample_rate * seconds), dtype=torch.float64) / sample_rate
    return (amplitude * torch.sin(2 * math.pi * freq * t)).float()[None]  # [1, N]


def peak_filter_hz(filters: torch.Tensor, bin_hz: float, energies: torch.Tensor) -> float:
    """Centre frequency (Hz) of the filter with the largest energy."""
    strongest = int(energies.argmax())
    return float(filters[strongest].argmax()) * bin_hz


def test_slaney_filterbank_triangles_have_unit_area_and_rising_centres() -> None:
    filters = slaney_mel_filterbank(24000, 1920, 80)  # [80, 961]
    assert filters.shape == (80, 961) and filters.dtype == torch.float32
    areas = filters.sum(dim=1) * (24000 / 1920)
    assert torch.allclose(areas, torch.ones(80), atol=0.1)
    peaks = filters.argmax(dim=1)
    assert bool((peaks[1:] > peaks[:-1]).all())


def test_whisper_log_mel_shape_range_and_tone_position() -> None:
    wave = tone(1000.0, 16000, 1.0) + noise(1, 16000, scale=0.001)
    log_mel = whisper_log_mel(wave)
    assert log_mel.shape == (1, 128, 100)
    assert float(log_mel.max() - log_mel.min()) <= 2.0 + 1e-6  # floored at max - 8 in log10, divided by 4
    energies = log_mel[0].mean(dim=1)
    assert abs(peak_filter_hz(slaney_mel_filterbank(16000, 400, 128), 40.0, energies) - 1000.0) <= 80.0


def test_whisper_log_mel_rows_are_independent() -> None:
    loud, quiet = tone(500.0, 16000, 0.5), tone(2000.0, 16000, 0.5, amplitude=0.01)
    batch = whisper_log_mel(torch.cat([loud, quiet]))
    assert torch.allclose(batch[0], whisper_log_mel(loud)[0], atol=1e-5)
    assert torch.allclose(batch[1], whisper_log_mel(quiet)[0], atol=1e-5)


def test_kaldi_fbank_frames_dc_removal_and_tone_order() -> None:
    wave = tone(1000.0, 16000, 0.5) + noise(1, 8000, scale=0.01)
    feats = kaldi_fbank(wave)
    assert feats.shape == (1 + (8000 - 400) // 160, 80)
    # each frame's mean is removed, so an offset changes only float rounding
    assert torch.allclose(kaldi_fbank(wave + 0.25), feats, atol=1e-2)
    low = kaldi_fbank(tone(500.0, 16000, 0.5)).mean(dim=0).argmax()
    high = kaldi_fbank(tone(3000.0, 16000, 0.5)).mean(dim=0).argmax()
    assert int(low) < int(high)


def test_campplus_fbank_is_mean_normalised() -> None:
    feats = campplus_fbank(tone(700.0, 16000, 0.7) + noise(1, 11200, scale=0.01))
    assert torch.allclose(feats.mean(dim=0), torch.zeros(80), atol=1e-4)


@pytest.mark.parametrize("samples", [1920, 24000, 55555])
def test_flow_mel_frame_count_and_floor(samples: int) -> None:
    mel = flow_mel(torch.zeros(2, samples))
    assert mel.shape == (2, (samples + 1440 - 1920) // 480 + 1, 80)
    assert torch.allclose(mel, torch.full_like(mel, math.log(1e-5)))


def test_flow_mel_tone_position() -> None:
    mel = flow_mel(tone(1000.0, 24000, 0.5))  # [1, T, 80]
    filters = slaney_mel_filterbank(24000, 1920, 80)
    assert abs(peak_filter_hz(filters, 12.5, mel[0].mean(dim=0)) - 1000.0) <= 100.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: whisper_log_mel(torch.zeros(16000)),
        lambda: whisper_log_mel(torch.zeros(1, 100)),
        lambda: kaldi_fbank(torch.zeros(1, 399)),
        lambda: kaldi_fbank(torch.zeros(2, 16000)),
        lambda: flow_mel(torch.zeros(1, 10, dtype=torch.int16)),
    ],
)
def test_bad_waveforms_raise_feature_error(call) -> None:
    with pytest.raises(FeatureError):
        call()


@pytest.mark.parametrize(("orig", "new"), [(44100, 16000), (48000, 24000), (22050, 24000), (16000, 24000)])
def test_resample_keeps_a_tone(orig: int, new: int) -> None:
    out = resample(tone(440.0, orig, 0.5), orig, new)
    assert out.shape == (1, math.ceil(new * int(orig * 0.5) / orig))
    expected = tone(440.0, new, out.shape[1] / new)
    assert torch.allclose(out[:, 300:-300], expected[:, 300:-300], atol=2e-3)


def test_resample_removes_content_above_the_new_nyquist() -> None:
    out = resample(tone(12000.0, 48000, 0.5), 48000, 16000)
    assert float(out[:, 300:-300].abs().max()) < 0.01


def test_resample_keeps_leading_dims_and_identity() -> None:
    wave = torch.randn(2, 3, 4410)
    assert resample(wave, 44100, 16000).shape == (2, 3, 1600)
    assert resample(wave, 16000, 16000) is wave


@pytest.mark.parametrize(
    ("wave", "orig", "new"),
    [
        (torch.zeros(10), 0, 16000),
        (torch.zeros(10), 16000.0, 24000),
        (torch.zeros(10, dtype=torch.int16), 8, 16),
    ],
)
def test_resample_rejects_bad_arguments(wave: torch.Tensor, orig, new) -> None:
    with pytest.raises(ResampleError):
        resample(wave, orig, new)
