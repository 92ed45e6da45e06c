"""The contract every speech backend implements.

A backend turns text into float32 mono PCM in [-1, 1] at its native ``sample_rate``. The engine
thread makes every call on a backend (construction aside), so backends need no locks.

A request is one ``BackendStream``: ``open_stream()`` must be cheap (start work, do not finish it);
``next_chunk()`` returns the next piece of audio or ``None`` when the utterance is complete.
``Backend.step()`` advances several streams by one chunk each. The default runs them one after the
other; a batching backend overrides it to run them as one batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class BackendStream(ABC):
    """One utterance being synthesised."""

    @abstractmethod
    def next_chunk(self) -> np.ndarray | None:
        """Return the next float32 mono chunk at the backend's rate, or ``None`` when done."""

    def close(self) -> None:  # noqa: B027 - optional hook; most streams hold nothing to free
        """Free what the stream holds. Called once, whether it finished, failed or was aborted."""


class Backend(ABC):
    """A speech backend. Subclasses set ``name``, ``sample_rate`` and ``default_voice``."""

    name: str
    sample_rate: int
    default_voice: str
    max_batch_size: int = 32
    """The most streams the engine passes to one ``step()`` call."""

    @abstractmethod
    def voices(self) -> list[str]:
        """The voice names ``open_stream()`` accepts."""

    @abstractmethod
    def open_stream(self, text: str, voice: str, speed: float) -> BackendStream:
        """Start synthesising ``text``; cheap, called in the engine thread."""

    def step(self, streams: list[BackendStream]) -> list[np.ndarray | None | BaseException]:
        """Advance each stream by one chunk.

        Returns one entry per stream, in order: a chunk, ``None`` when that stream is finished, or the
        exception it raised (which fails only that stream).
        """
        results: list[np.ndarray | None | BaseException] = []
        for stream in streams:
            try:
                results.append(stream.next_chunk())
            except Exception as exc:  # noqa: BLE001 - one stream's failure must not stop the others
                results.append(exc)
        return results

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free the backend's resources. Called once, in the engine thread, when the engine closes."""
