"""Per-request state of the CosyVoice backend: text segments, each an LLM request plus a token2wav stream.

A request's text is normalised and split into segments (upstream's frontend rules); every segment is
its own LLM generation and its own token->wave stream, played one after the other. The LLM of segment
k + 1 may run while segment k still has hops to vocode; audio always comes out in segment order.

Only the backend's ``step()`` (engine thread) touches this state. Nothing here runs a model: the
backend batches the LLM and token2wav work of many requests and hands each one its share.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cosyvoice.llm import LLMRequest
from cosyvoice.token2wav import HopJob, SpeakerPrompt, Token2Wav, Token2WavStream
from tts_engine.backends.base import BackendStream

__all__ = ["CosyVoiceStream", "Segment", "SpeedScaledStream", "fit_kv_slot", "segment_seed"]

_EMPTY = np.zeros(0, dtype=np.float32)


class SpeedScaledStream(Token2WavStream):
    """An offline token2wav stream whose mel is time-scaled by ``1 / speed`` before vocoding.

    As upstream: speed changes only in non-streaming mode, by linear interpolation of the whole mel
    of the utterance (one full-attention flow pass once the LLM has finished).
    """

    def __init__(self, owner: Token2Wav, prompt: SpeakerPrompt, *, speed: float) -> None:
        super().__init__(owner, prompt, stream=False)
        self.speed = speed

    def _apply(self, job: HopJob, new_mel: torch.Tensor) -> None:
        frames = max(1, int(new_mel.shape[-1] / self.speed))
        scaled = F.interpolate(new_mel.float(), size=frames, mode="linear").to(new_mel.dtype)  # [1, 80, m']
        super()._apply(job, scaled)


@dataclass(eq=False)
class Segment:
    """One text segment: its LLM request and its token2wav stream."""

    text: str
    llm: LLMRequest
    wave: Token2WavStream
    num_pushed: int = 0  # LLM flow tokens already handed to ``wave``

    def feed(self) -> None:
        """Hand the LLM's new (silence-filtered) tokens to the wave stream; end its input once done."""
        tokens = self.llm.flow_tokens
        if self.num_pushed < len(tokens):
            self.wave.add_tokens(tokens[self.num_pushed :])
            self.num_pushed = len(tokens)
        if self.llm.finished and not self.wave.input_ended:
            self.wave.end_input()

    @property
    def is_done(self) -> bool:
        wave = self.wave
        return wave.done or (wave.input_ended and not wave.tokens)  # an empty generation yields no audio


@dataclass(eq=False)
class CosyVoiceStream(BackendStream):
    """One synthesis request of :class:`~tts_engine.backends.cosyvoice.CosyVoiceBackend`."""

    owner: object  # the backend that opened it (streams of another backend are refused by step())
    segments: list[Segment]
    on_close: Callable[[CosyVoiceStream], None]
    voice: str = ""
    closed: bool = False
    parked: bool = False  # its KV cache is in host memory (park()); it is not stepped meanwhile
    _current: int = 0  # index of the segment whose audio plays now

    # -- scheduler view ------------------------------------------------------------------------

    def llm_request(self) -> LLMRequest | None:
        """The LLM request that should advance now (the first unfinished one), if any."""
        if self.closed or self.parked:
            return None
        for segment in self.segments[self._current :]:
            if not segment.llm.finished:
                return segment.llm
        return None

    def feed_tokens(self) -> None:
        for segment in self.segments[self._current :]:
            segment.feed()

    def next_job(self) -> HopJob | None:
        """The token2wav call the current segment can run now."""
        self._skip_done()
        if self.closed or self._current >= len(self.segments):
            return None
        return self.segments[self._current].wave.next_job()

    @property
    def holds_capacity(self) -> bool:
        """A KV cache slot is still needed: some segment from the current one on has LLM work left."""
        if self.closed:
            return False
        self._skip_done()
        return any(not segment.llm.finished for segment in self.segments[self._current :])

    @property
    def awaits_opening(self) -> bool:
        """Its current segment has had no token2wav call yet: its next audio is an opening hop."""
        self._skip_done()
        if self.closed or self._current >= len(self.segments):
            return False
        return self.segments[self._current].wave.token_offset == 0

    def take(self, chunk: torch.Tensor | None) -> torch.Tensor | np.ndarray | None:
        """This step's result for the engine: audio (maybe empty), or None once everything was played."""
        self._skip_done()
        if chunk is not None and chunk.numel():
            return chunk.detach()  # stays on the device: the engine post-processes it there
        if self._current >= len(self.segments):
            return None
        return _EMPTY

    def _skip_done(self) -> None:
        while self._current < len(self.segments) and self.segments[self._current].is_done:
            self._current += 1

    @property
    def is_finished(self) -> bool:
        self._skip_done()
        return self._current >= len(self.segments)

    def park(self, runner: Any) -> None:
        """Move the KV cache of the segment that holds a slot to host memory (``runner.swap_out``)."""
        for segment in self.segments[self._current :]:
            runner.swap_out(segment.llm)
        self.parked = True

    def unpark(self, runner: Any) -> None:
        """Put a parked stream's KV cache back in a slot; it goes on where it stopped."""
        for segment in self.segments[self._current :]:
            runner.swap_in(segment.llm)
        self.parked = False

    # -- BackendStream -------------------------------------------------------------------------

    def next_chunk(self) -> np.ndarray | None:
        """Advance this request alone (the engine uses the backend's batched ``step()`` instead)."""
        result = self.owner.step([self])[0]  # type: ignore[attr-defined]
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        """Free the request's KV cache slot at once; idempotent."""
        if not self.closed:
            self.closed = True
            self.on_close(self)


def segment_seed(seed: int | None, piece: str, voice: str, instruct: str | None) -> int:
    """Per-segment sampling seed: from ``seed`` and the content (batch-independent), else random."""
    if seed is None:
        return secrets.randbits(63)
    key = f"{seed}\0{voice}\0{instruct or ''}\0{piece}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


def fit_kv_slot(llm: LLMRequest, max_llm_len: int) -> None:
    """Cap the generation length so the request fits one KV cache slot; refuse a prefix that cannot."""
    room = max_llm_len - llm.num_prefix_tokens + 1
    if room < 1:
        raise ValueError(
            f"text segment needs {llm.num_prefix_tokens} prompt positions; the KV cache holds "
            f"{max_llm_len} per request (shorten the text or the voice's prompt)"
        )
    llm.max_len = min(llm.max_len, room)
    llm.min_len = min(llm.min_len, llm.max_len)
