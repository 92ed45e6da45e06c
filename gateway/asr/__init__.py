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
    create_asr,
)

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
]
