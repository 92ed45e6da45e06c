"""Causal HiFT vocoder of CosyVoice3: mel (50 Hz, 80 bins) -> 24 kHz waveform."""

from cosyvoice.hift.buffers import (
    HiftNoiseBuffers,
    hift_buffers_from_rng_state,
    official_flow_noise,
    official_hift_rng_state,
)
from cosyvoice.hift.errors import HiftError, HiftInputError
from cosyvoice.hift.generator import CausalHift, HiftOutput
from cosyvoice.hift.loading import fold_hift_state, load_hift, official_hift_buffers
from cosyvoice.hift.source import PhaseResume
from cosyvoice.hift.stream import HiftStreamState, vocode_streams

__all__ = [
    "CausalHift",
    "HiftError",
    "HiftInputError",
    "HiftNoiseBuffers",
    "HiftOutput",
    "HiftStreamState",
    "PhaseResume",
    "fold_hift_state",
    "hift_buffers_from_rng_state",
    "load_hift",
    "official_flow_noise",
    "official_hift_buffers",
    "official_hift_rng_state",
    "vocode_streams",
]
