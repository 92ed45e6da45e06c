"""The ASR interface the session talks to, and the default 'not configured' backend."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class ASRError(Exception):
    """Recognition failed for one utterance."""


class ASRNotConfigured(ASRError):
    """No recognizer is configured; the session answers with a spoken notice."""


class ASR(Protocol):
    name: str

    async def transcribe(self, pcm16k: np.ndarray) -> str:
        """Text of one utterance (int16 mono, 16 kHz); "" when nothing was said."""
        ...

    async def aclose(self) -> None: ...


class NotConfiguredASR:
    name = "none"

    async def transcribe(self, pcm16k: np.ndarray) -> str:
        raise ASRNotConfigured("speech recognition is not configured")

    async def aclose(self) -> None:
        return None


def create_asr(backend: str) -> ASR:
    if backend == "none":
        return NotConfiguredASR()
    raise ValueError(f"unknown ASR backend {backend!r}")
