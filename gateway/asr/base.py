"""The ASR interface the session talks to, the 'not configured' backend, and the factory."""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

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
