"""The ASR interface the session talks to, the 'not configured' backend, and the factory."""

from __future__ import annotations

import importlib.util
import logging
from typing import Protocol

import numpy as np

from gateway.config import ASRConfig, GPUConfig

log = logging.getLogger(__name__)


class ASRError(Exception):
    """Recognition failed for one utterance."""


class ASRNotConfigured(ASRError):
    """No recognizer is configured; the session answers with a spoken notice."""


class ASRBusy(ASRError):
    """Too many utterances are waiting for the recognizer; this one is refused."""


class ASRInputError(ASRError, ValueError):
    """The audio given for recognition is not mono 16 kHz PCM."""


class ASRLoadError(Exception):
    """The configured recognizer cannot be loaded (a start-up error)."""


class ASRModelMissing(ASRLoadError):
    """The configured model is neither a local directory nor obtainable."""


class ASR(Protocol):
    name: str

    async def transcribe(self, pcm16k: np.ndarray) -> str:
        """Text of one utterance (int16 mono, 16 kHz); "" when nothing was said."""
        ...

    async def aclose(self) -> None: ...


class NotConfiguredASR:
    name = "none"

    def __init__(self, reason: str | None = None) -> None:
        self.warning = reason

    async def transcribe(self, pcm16k: np.ndarray) -> str:
        raise ASRNotConfigured("speech recognition is not configured")

    async def aclose(self) -> None:
        return None


def funasr_installed() -> bool:
    return importlib.util.find_spec("funasr") is not None


def create_asr(cfg: ASRConfig | str, gpu: GPUConfig | None = None) -> ASR:
    """The recognizer `cfg.backend` asks for (see config.yaml, section asr).

    `auto` never fails: without FunASR or its model it gives the 'not configured'
    backend and logs why. `funasr` raises `ASRLoadError` unless
    `on_load_failure: not_configured`. Raises `VADUnavailable` when the Silero
    VAD model (a core dependency) cannot be loaded.
    """
    if isinstance(cfg, str):
        cfg = ASRConfig(backend=cfg)
    from gateway.asr.vad import SileroVAD

    SileroVAD.shared()  # the VAD of every session: a missing model file stops the start-up here
    if cfg.backend == "none":
        return NotConfiguredASR()
    if cfg.backend == "auto" and not funasr_installed():
        return _off("FunASR is not installed (scripts/setup.sh installs it)")
    from gateway.asr.funasr_backend import FunASRBackend  # imports torch; only when needed

    try:
        if cfg.backend == "auto":
            FunASRBackend.locate_model(cfg)  # cheap: no download attempt without a place to get it
        return FunASRBackend.load(cfg, gpu)
    except ASRLoadError as exc:
        if cfg.backend == "auto" or cfg.on_load_failure == "not_configured":
            return _off(str(exc))
        raise


def _off(reason: str) -> NotConfiguredASR:
    log.warning("!!! speech recognition is off: %s", reason)
    return NotConfiguredASR(reason)
