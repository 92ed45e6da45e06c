"""The contract every speech backend implements.

A backend turns text into float32 mono PCM in [-1, 1] at its native ``sample_rate``. The engine
thread makes every call on a backend (construction aside), so backends need no locks.

A request is one ``BackendStream``: ``open_stream()`` must be cheap (start work, do not finish it);
``next_chunk()`` returns the next piece of audio or ``None`` when the utterance is complete.
``Backend.step()`` advances several streams by one chunk each (chunks may be float tensors on
``device``). The default runs them one after the other; a batching backend overrides it to run them
as one batch. ``limits()`` declares, once, how many streams may be open at once (the rest queue) and
the per-step row caps; the engine's scheduler counts against them and hands each step a
``StepBudget`` that ``step()`` obeys (tts_engine/budget.py). ``memory_stats()`` reports the backend's
memory plan and use.

A backend whose limits say ``splits_steps`` gets the budget's ``lanes`` and an ``on_chunks`` keyword:
``step(streams, budget, on_chunks=callback)`` runs the urgent lane's audio work first and hands its
chunks out through ``callback([(index, chunk), ...])`` before the rest runs (those streams' entries in the
returned list then carry an empty chunk, or ``None`` once they are done). One whose limits say
``can_park`` implements ``park()``/``unpark()``: a parked stream holds none of ``max_streams`` and is not
stepped until it is resumed, with its state intact (the scheduler parks batch streams for higher classes).

Voices: ``voices()`` names the built-in ones. A backend that can clone (``supports_cloning``) also takes
presets at run time through ``add_voice()``/``remove_voice()`` and one-off prompt recordings through
``open_zero_shot_stream()``. ``instruct`` (a style instruction, CosyVoice's instruct mode) reaches
``open_stream()`` only on backends with ``supports_instruct``; the others never see it and ignore it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from tts_engine.budget import UNCAPPED, BackendLimits, StepBudget
from tts_engine.voices import VoiceError

if TYPE_CHECKING:
    from tts_engine.voices import PromptAudio, VoicePreset


ChunkSink = Callable[[list[tuple[int, Any]]], None]
"""``on_chunks``: audio handed out mid-step, as (index in the step's streams, chunk)."""


class SplitStepper(Protocol):
    """The ``step()`` of a backend whose limits say ``splits_steps``."""

    def step(
        self,
        streams: list[BackendStream],
        budget: StepBudget,
        *,
        on_chunks: ChunkSink,
        should_yield: Callable[[], bool] | None = None,
    ) -> list[np.ndarray | None | BaseException]:
        """One step: the urgent lane's audio goes to ``on_chunks`` before the rest runs; once that audio
        is out, a true ``should_yield()`` (a new request arrived) leaves the work that can wait for the
        next step."""
        ...


class BackendStream(ABC):
    """One utterance being synthesised."""

    @property
    def holds_capacity(self) -> bool:
        """It still needs its share of the backend's ``max_streams`` (the scheduler's capacity count). True
        until it ends, unless the backend knows better: a CosyVoice stream gives its KV cache slot back
        once the LLM of its last segment has finished, and its remaining hops need none."""
        return True

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
    device: torch.device = torch.device("cpu")
    """Where ``step()``'s chunks live (a chunk may be a float ``torch.Tensor`` there); the engine
    resamples and converts them to int16 on this device before one copy to the host."""
    supports_cloning: bool = False
    """``add_voice()``, ``remove_voice()`` and ``open_zero_shot_stream()`` work."""
    supports_instruct: bool = False
    """``open_stream()`` takes ``instruct``; without it the engine drops the instruction."""
    reads_raw_text: bool = False
    """The backend reads digits and symbols itself: the engine's text normaliser is not applied."""
    max_text_chars: int | None = None
    """The longest text ``open_stream()`` takes (None: no limit); the engine refuses longer text at once
    and announces the number (worker hello, ``/v1/health``), so the API refuses it before it is sent."""

    @abstractmethod
    def voices(self) -> list[str]:
        """The voice names ``open_stream()`` accepts."""

    @abstractmethod
    def open_stream(self, text: str, voice: str, speed: float, instruct: str | None = None) -> BackendStream:
        """Start synthesising ``text``; cheap, called in the engine thread.

        ``instruct`` is passed only when ``supports_instruct`` is set (backends without it may keep the
        three-argument signature).
        """

    def limits(self) -> BackendLimits:
        """What the backend can hold, declared once (read when the engine is built). The engine admits
        at most ``max_streams`` streams and queues the rest; an open stream holds its share until it is
        closed. The default: no stream limit, ``max_batch_size`` streams a step, no row caps."""
        return BackendLimits(max_batch_size=max(1, self.max_batch_size))

    def capacity(self) -> int | None:
        """The most streams that may be open at once (None: no limit): ``limits().max_streams``."""
        return self.limits().max_streams

    def memory_stats(self) -> dict[str, int | float]:
        """Memory budget and use, for health and metrics (numbers only; empty when not tracked)."""
        return {}

    def step_stats(self) -> dict[str, int | float]:
        """Counters of the backend's own step policy, for metrics (numbers only; empty when none)."""
        return {}

    def add_voice(self, preset: VoicePreset) -> None:
        """Prepare ``preset`` (once; may read or write a feature cache) and offer it by name."""
        raise VoiceError(f"backend {self.name} cannot clone voices")

    def remove_voice(self, name: str) -> None:
        """Stop offering a voice added by ``add_voice()``; streams already open keep working."""
        raise VoiceError(f"backend {self.name} cannot clone voices")

    def open_zero_shot_stream(
        self, text: str, prompt: PromptAudio, prompt_text: str, speed: float, instruct: str | None = None
    ) -> BackendStream:
        """Like ``open_stream()`` with a one-off prompt recording (prepared here, not cached)."""
        raise VoiceError(f"backend {self.name} cannot clone voices")

    def step(
        self, streams: list[BackendStream], budget: StepBudget = UNCAPPED
    ) -> list[np.ndarray | None | BaseException]:
        """Advance each stream by one chunk, within ``budget`` (streams in rank order).

        Returns one entry per stream, in order: a chunk, ``None`` when that stream is finished, or the
        exception it raised (which fails only that stream). The engine passes ``budget`` only when it
        caps something (a backend that declares no row caps may keep the one-argument signature); a
        stream the budget leaves out this step gets an empty chunk.
        """
        results: list[np.ndarray | None | BaseException] = []
        for stream in streams:
            try:
                results.append(stream.next_chunk())
            except Exception as exc:  # noqa: BLE001 - one stream's failure must not stop the others
                results.append(exc)
        return results

    def park(self, stream: BackendStream) -> bool:
        """Release ``stream``'s share of ``max_streams`` keeping its state (only with ``can_park``); False
        when it cannot (the stream keeps its share)."""
        return False

    def unpark(self, stream: BackendStream) -> None:  # noqa: B027 - with park()
        """Take a parked stream's share back; it is stepped again from where it stopped."""

    def wake(self) -> None:  # noqa: B027 - optional hook
        """The engine has a new command (request, abort, ...). Called from any thread; a backend whose
        ``step()`` may block waiting for its own work returns from that wait early (see espeak)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free the backend's resources. Called once, in the engine thread, when the engine closes."""
