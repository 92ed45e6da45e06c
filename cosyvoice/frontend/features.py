"""Prompt-audio features in plain torch, matching the official CosyVoice3 frontend.

* :func:`whisper_log_mel` - the speech tokenizer's input (whisper ``log_mel_spectrogram``, 128 bins,
  16 kHz): STFT n_fft 400 / hop 160 / periodic Hann, centred with reflect padding, last frame
  dropped, power, Slaney mel, log10 floored at 1e-10 and at (max - 8), then (x + 4) / 4.
* :func:`kaldi_fbank` / :func:`campplus_fbank` - the speaker encoder's input (Kaldi fbank, 80 bins,
  16 kHz, dither 0, on the [-1, 1] waveform), then per-bin mean subtraction over time.
* :func:`flow_mel` - the flow prompt mel (matcha ``mel_spectrogram``, 24 kHz): reflect pad
  (n_fft - hop) / 2, STFT without centring, magnitude sqrt(re^2 + im^2 + 1e-9), Slaney mel,
  natural log floored at 1e-5; returned time-major ``[B, T, 80]``.

All functions take ``[B, N]`` float waveforms on any device and return float32 on that device.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor

__all__ = [
    "FeatureError",
    "campplus_fbank",
    "flow_mel",
    "kaldi_fbank",
    "kaldi_mel_banks",
    "slaney_mel_filterbank",
    "whisper_log_mel",
]


class FeatureError(ValueError):
    """A waveform argument has the wrong shape or is too short for the requested features."""


def _check_wave(wave: Tensor, min_samples: int, name: str) -> Tensor:
    if not isinstance(wave, Tensor) or wave.dim() != 2 or not wave.is_floating_point():
        raise FeatureError(f"{name}: expected a float waveform tensor [B, N]")
    if wave.shape[1] < min_samples:
        raise FeatureError(f"{name}: needs at least {min_samples} samples, got {wave.shape[1]}")
    return wave.float()


def _hz_to_slaney_mel(hz: Tensor) -> Tensor:
    # linear below 1 kHz (200/3 Hz per mel), logarithmic above (27 mels per factor 6.4)
    linear = hz / (200.0 / 3.0)
    log_part = 15.0 + torch.log(hz.clamp(min=1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return torch.where(hz >= 1000.0, log_part, linear)


def _slaney_mel_to_hz(mel: Tensor) -> Tensor:
    linear = mel * (200.0 / 3.0)
    log_part = 1000.0 * torch.exp((math.log(6.4) / 27.0) * (mel - 15.0))
    return torch.where(mel >= 15.0, log_part, linear)


@lru_cache(maxsize=8)
def slaney_mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> Tensor:
    """librosa's default mel filterbank (Slaney scale, Slaney area norm): float32 ``[n_mels, n_fft//2 + 1]``."""
    fmax = sample_rate / 2.0 if fmax is None else fmax
    fft_freqs = torch.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1, dtype=torch.float64)
    mel_edges = torch.linspace(
        float(_hz_to_slaney_mel(torch.tensor(fmin, dtype=torch.float64))),
        float(_hz_to_slaney_mel(torch.tensor(fmax, dtype=torch.float64))),
        n_mels + 2,
        dtype=torch.float64,
    )
    hz_edges = _slaney_mel_to_hz(mel_edges)  # [n_mels + 2]
    widths = hz_edges[1:] - hz_edges[:-1]  # [n_mels + 1]
    ramps = hz_edges[:, None] - fft_freqs[None, :]  # [n_mels + 2, n_freqs]
    rising = -ramps[:-2] / widths[:-1, None]  # [n_mels, n_freqs]
    falling = ramps[2:] / widths[1:, None]  # [n_mels, n_freqs]
    weights = torch.clamp(torch.minimum(rising, falling), min=0.0)
    weights = weights * (2.0 / (hz_edges[2:] - hz_edges[:-2]))[:, None]
    return weights.float()


@lru_cache(maxsize=4)
def kaldi_mel_banks(
    num_bins: int, padded_window: int, sample_rate: float, low_freq: float, high_freq: float
) -> Tensor:
    """Kaldi triangular mel banks (mel = 1127 ln(1 + f/700)): float32 ``[num_bins, padded_window//2 + 1]``.

    ``high_freq <= 0`` counts down from Nyquist, as in Kaldi. The Nyquist column is all zeros. The
    band edges are Python floats and the slopes float32, the precision the reference fbank uses
    (a float64 bank moves log energies by up to ~2e-4).
    """
    nyquist = sample_rate / 2.0
    high_freq = high_freq + nyquist if high_freq <= 0.0 else high_freq
    bin_width = sample_rate / padded_window
    mel_low = 1127.0 * math.log(1.0 + low_freq / 700.0)
    mel_high = 1127.0 * math.log(1.0 + high_freq / 700.0)
    delta = (mel_high - mel_low) / (num_bins + 1)
    index = torch.arange(num_bins, dtype=torch.float32)[:, None]  # [num_bins, 1]
    left = mel_low + index * delta
    center = mel_low + (index + 1.0) * delta
    right = mel_low + (index + 2.0) * delta
    freqs = bin_width * torch.arange(padded_window // 2, dtype=torch.float32)
    bin_mels = (1127.0 * (1.0 + freqs / 700.0).log())[None, :]  # [1, padded_window // 2]
    up = (bin_mels - left) / (center - left)
    down = (right - bin_mels) / (right - center)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)  # [num_bins, padded_window // 2]
    return torch.nn.functional.pad(banks, (0, 1))  # [num_bins, padded_window // 2 + 1]


def whisper_log_mel(wave16k: Tensor, n_mels: int = 128) -> Tensor:
    """Whisper log-mel of 16 kHz audio: ``[B, N]`` -> ``[B, n_mels, N // 160]``.

    The (max - 8) floor uses each row's own maximum (whisper's whole-tensor max for B = 1).
    """
    wave = _check_wave(wave16k, 201, "whisper_log_mel")  # reflect padding needs > n_fft / 2
    window = torch.hann_window(400, device=wave.device)
    spec = torch.stft(wave, 400, 160, window=window, center=True, pad_mode="reflect", return_complex=True)
    power = spec[..., :-1].abs() ** 2  # [B, 201, N // 160]
    filters = slaney_mel_filterbank(16000, 400, n_mels).to(wave.device)
    mel = filters @ power  # [B, n_mels, T]
    log_spec = torch.clamp(mel, min=1e-10).log10()
    row_max = log_spec.amax(dim=(1, 2), keepdim=True)  # [B, 1, 1]
    log_spec = torch.maximum(log_spec, row_max - 8.0)
    return (log_spec + 4.0) / 4.0


def kaldi_fbank(
    wave16k: Tensor,
    *,
    num_mel_bins: int = 80,
    sample_rate: int = 16000,
    frame_length_ms: float = 25.0,
    frame_shift_ms: float = 10.0,
    preemphasis: float = 0.97,
    low_freq: float = 20.0,
    high_freq: float = 0.0,
) -> Tensor:
    """Kaldi log mel fbank (dither 0, snip_edges, DC removal, povey window, power): ``[N]`` -> ``[T, bins]``.

    ``wave16k`` is one waveform ``[N]`` or ``[1, N]``, values as given (not rescaled to int16).
    """
    if isinstance(wave16k, Tensor) and wave16k.dim() == 1:
        wave16k = wave16k[None]
    if isinstance(wave16k, Tensor) and wave16k.dim() == 2 and wave16k.shape[0] != 1:
        raise FeatureError("kaldi_fbank: expected one waveform [N] or [1, N]")
    window_size = int(sample_rate * frame_length_ms / 1000.0)
    window_shift = int(sample_rate * frame_shift_ms / 1000.0)
    wave = _check_wave(wave16k, window_size, "kaldi_fbank")[0]
    padded = 1 << (window_size - 1).bit_length()  # next power of two: 400 -> 512
    frames = wave.unfold(0, window_size, window_shift)  # [T, window_size]
    frames = frames - frames.mean(dim=1, keepdim=True)
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)  # first sample repeats itself
    frames = frames - preemphasis * previous
    povey = torch.hann_window(window_size, periodic=False, device=wave.device).pow(0.85)
    frames = torch.nn.functional.pad(frames * povey, (0, padded - window_size))  # [T, padded]
    power = torch.fft.rfft(frames).abs().pow(2.0)  # [T, padded // 2 + 1]
    banks = kaldi_mel_banks(num_mel_bins, padded, float(sample_rate), low_freq, high_freq).to(wave.device)
    energies = power @ banks.T  # [T, num_mel_bins]
    return torch.clamp(energies, min=torch.finfo(torch.float32).eps).log()


def campplus_fbank(wave16k: Tensor) -> Tensor:
    """CAM++ input: 80-bin Kaldi fbank minus its mean over time, ``[N]`` or ``[1, N]`` -> ``[T, 80]``."""
    feats = kaldi_fbank(wave16k)
    return feats - feats.mean(dim=0, keepdim=True)


def flow_mel(
    wave24k: Tensor,
    *,
    n_fft: int = 1920,
    num_mels: int = 80,
    sample_rate: int = 24000,
    hop_size: int = 480,
    win_size: int = 1920,
    fmin: float = 0.0,
    fmax: float | None = None,
) -> Tensor:
    """Flow prompt mel (matcha, center=False): ``[B, N]`` -> ``[B, (N + 2p - n_fft) // hop + 1, num_mels]``.

    ``p = (n_fft - hop_size) // 2`` reflect padding on each side (720 at the defaults).
    """
    pad = (n_fft - hop_size) // 2
    wave = _check_wave(wave24k, max(pad + 1, n_fft - 2 * pad), "flow_mel")
    wave = torch.nn.functional.pad(wave[:, None], (pad, pad), mode="reflect")[:, 0]  # [B, N + 2 pad]
    window = torch.hann_window(win_size, device=wave.device)
    spec = torch.stft(
        wave, n_fft, hop_size, win_size, window=window, center=False, onesided=True, return_complex=True
    )  # [B, n_fft // 2 + 1, T]
    magnitude = torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + 1e-9)
    filters = slaney_mel_filterbank(sample_rate, n_fft, num_mels, fmin, fmax).to(wave.device)
    mel = torch.log(torch.clamp(filters @ magnitude, min=1e-5))  # [B, num_mels, T]
    return mel.transpose(1, 2)  # [B, T, num_mels]
