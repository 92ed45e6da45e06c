"""What the flow stage is: the DiT estimator's sizes, the CFM solver's settings, the token front.

Defaults are the Fun-CosyVoice3-0.5B release's. :func:`cosyvoice.config.load_config` fills these from
``cosyvoice3.yaml``; :meth:`cosyvoice.flow.Flow.from_state_dict` from the checkpoint's tensor shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["NOISE_FRAMES", "NOISE_SEED", "CFMConfig", "DiTConfig", "FlowConfig"]

NOISE_SEED = 0  # the fixed noise buffer: manual_seed(0); randn(1, mel_dim, noise_frames)
NOISE_FRAMES = 15000  # 300 s at 50 frames/s: the longest prompt+target sequence


@dataclass(frozen=True, slots=True, kw_only=True)
class DiTConfig:
    """Structural sizes of the estimator (release: dim 1024, depth 22, heads 16, dim_head 64)."""

    dim: int
    depth: int
    heads: int
    dim_head: int
    ff_dim: int  # the yaml's dim * ff_mult
    mel_dim: int = 80  # also the width of the output projection (the yaml's out_channels)
    mu_dim: int = 80
    spk_dim: int = 80
    freq_embed_dim: int = 256  # not in the yaml: the same in every release
    conv_kernel: int = 31
    conv_groups: int = 16
    static_chunk_size: int = 50  # mel frames per chunk of the streaming attention mask (chunk_size * ratio)
    num_decoding_left_chunks: int = -1  # < 0: all left chunks

    def __post_init__(self) -> None:
        positive = ("dim", "depth", "heads", "dim_head", "ff_dim", "mel_dim", "mu_dim", "freq_embed_dim")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"DiTConfig.{name} must be positive, got {getattr(self, name)}")
        if self.dim_head % 2 or self.freq_embed_dim % 2:
            raise ValueError("DiTConfig.dim_head and freq_embed_dim must be even")
        if self.conv_kernel % 2 == 0 or self.dim % self.conv_groups:
            raise ValueError("DiTConfig.conv_kernel must be odd and divide dim into conv_groups")
        if self.static_chunk_size < 0:
            raise ValueError("DiTConfig.static_chunk_size must be >= 0 (0 = no chunk mask)")

    @property
    def inner_dim(self) -> int:
        return self.heads * self.dim_head

    @property
    def in_dim(self) -> int:
        """Width of the input projection: cat[x, cond, mu, spk]."""
        return 2 * self.mel_dim + self.mu_dim + self.spk_dim

    @property
    def modulation_dim(self) -> int:
        """Width of one step's AdaLN vector: 6 per block plus 2 for the output norm."""
        return (6 * self.depth + 2) * self.dim


@dataclass(frozen=True, slots=True, kw_only=True)
class CFMConfig:
    """The conditional flow matching solver (the yaml's ``decoder`` and its ``cfm_params``)."""

    inference_cfg_rate: float = 0.7
    sigma_min: float = 1e-6
    solver: str = "euler"
    t_scheduler: str = "cosine"
    training_cfg_rate: float = 0.2
    in_channels: int = 240
    n_spks: int = 1
    spk_emb_dim: int = 80
    noise_seed: int = NOISE_SEED
    noise_frames: int = NOISE_FRAMES


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowConfig:
    """Sizes and constants of the flow (official ``CausalMaskedDiffWithDiT``)."""

    dit: DiTConfig
    cfm: CFMConfig = field(default_factory=CFMConfig)
    vocab_size: int = 6561
    mel_dim: int = 80  # token embedding width and mel bins (the yaml's input_size and output_size)
    spk_embed_dim: int = 192
    pre_lookahead_channels: int = 1024
    pre_lookahead_len: int = 3
    token_mel_ratio: int = 2
    input_frame_rate: int = 25  # speech tokens per second
    n_timesteps: int = 10  # Euler steps per flow call (hard-coded upstream)
