"""Speech recognition behind one small interface: VAD (vad.py) and FunASR (funasr_backend.py)."""

from gateway.asr.base import (
    ASR,
    ASRBusy,
    ASRError,
    ASRInputError,
    ASRLoadError,
    ASRModelMissing,
    ASRNotConfigured,
    NotConfiguredASR,
)
from gateway.asr.factory import create_asr, funasr_installed

__all__ = [
    "ASR",
    "ASRBusy",
    "ASRError",
    "ASRInputError",
    "ASRLoadError",
    "ASRModelMissing",
    "ASRNotConfigured",
    "NotConfiguredASR",
    "create_asr",
    "funasr_installed",
]
