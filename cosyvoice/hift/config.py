"""What the HiFT vocoder is: its sizes and constants (:func:`cosyvoice.config.load_config` fills them from
the yaml's ``hift`` section)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HiFTConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HiFTConfig:
    in_channels: int
    base_channels: int
    nb_harmonics: int
    sampling_rate: int
    nsf_alpha: float
    nsf_sigma: float
    nsf_voiced_threshold: float
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    istft_n_fft: int
    istft_hop_len: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    source_resblock_kernel_sizes: tuple[int, ...]
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    lrelu_slope: float
    audio_limit: float
    conv_pre_look_right: int
    f0_num_class: int
    f0_in_channels: int
    f0_cond_channels: int

    @property
    def samples_per_frame(self) -> int:
        """Waveform samples per mel frame (480 at 24 kHz)."""
        total = self.istft_hop_len
        for rate in self.upsample_rates:
            total *= rate
        return total
