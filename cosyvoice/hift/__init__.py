"""Causal HiFT vocoder of CosyVoice3: mel (50 Hz, 80 bins) -> 24 kHz waveform."""

from cosyvoice.hift.buffers import (
    HiftNoiseBuffers,
    hift_buffers_from_rng_state,
    official_flow_noise,
    official_hift_rng_state,
)
from cosyvoice.hift.config import HiFTConfig
from cosyvoice.hift.errors import HiftError, HiftInputError
from cosyvoice.hift.generator import CausalHift, HiftOutput
from cosyvoice.hift.loading import fold_hift_state
from cosyvoice.hift.source import PhaseResume
from cosyvoice.hift.stream import HiftStreamState, vocode_streams

__all__ = [
    "CausalHift",
    "HiFTConfig",
    "HiftError",
    "HiftInputError",
    "HiftNoiseBuffers",
    "HiftOutput",
    "HiftStreamState",
    "PhaseResume",
    "fold_hift_state",
    "hift_buffers_from_rng_state",
    "official_flow_noise",
    "official_hift_rng_state",
    "vocode_streams",
]
