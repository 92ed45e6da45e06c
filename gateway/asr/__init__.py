"""Speech recognition behind one small interface (VAD + FunASR arrive later)."""

from gateway.asr.base import ASR, ASRError, ASRNotConfigured, NotConfiguredASR, create_asr

__all__ = ["ASR", "ASRError", "ASRNotConfigured", "NotConfiguredASR", "create_asr"]
