"""CosyVoice3 flow stage: speech tokens -> 80-bin mel (DiT estimator, CFM solver, token front)."""

from .cfm import CausalCFM, euler_schedule, fixed_noise
from .config import CFMConfig, DiTConfig, FlowConfig
from .dit import DiT, attention_mask, chunk_mask
from .errors import FlowCheckpointError, FlowError, FlowInputError
from .flow import Flow, PreLookaheadLayer

__all__ = [
    "CFMConfig",
    "CausalCFM",
    "DiT",
    "DiTConfig",
    "Flow",
    "FlowCheckpointError",
    "FlowConfig",
    "FlowError",
    "FlowInputError",
    "PreLookaheadLayer",
    "attention_mask",
    "chunk_mask",
    "euler_schedule",
    "fixed_noise",
]
