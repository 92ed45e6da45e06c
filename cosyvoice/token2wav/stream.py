"""Speech tokens -> 24 kHz waveform: the official CosyVoice3 token2wav loop, state held per request.

Shared, stateless pieces live in :class:`Token2Wav` (the flow and the HiFT). Each request owns a
:class:`Token2WavStream` holding its prompt, the tokens received so far, the token offset, its current
hop, the accumulated mel and the number of samples already emitted. Nothing per request is stored on the
shared object, so any number of streams can run on one model.

Streaming schedule (upstream ``CosyVoice2Model.tts``, fresh state for every request): hops of 25 -> 50 ->
100 tokens, the first one padded by ``ceil(P / 25) * 25 - P`` (P prompt tokens) so later hop boundaries
fall on the flow's 50-frame attention chunks. A hop fires once ``offset + hop + 3`` tokens are known (3
look-ahead tokens): the flow runs over prompt + ``tokens[:offset + hop + 3]`` with the chunk mask and
``finalize=False``, the mel after ``2 * offset`` frames is appended to the request's mel, the HiFT
re-vocodes the whole accumulated mel with ``finalize=False`` and the new samples are emitted. At the end
one full-attention ``finalize=True`` flow call over all tokens and a ``finalize=True`` HiFT call produce
the rest. Offline synthesis is that last call alone. No polling: the caller pushes tokens and gets back
whatever became ready.

For batching across requests, :meth:`Token2WavStream.next_job` plans a stream's next call and
:meth:`Token2Wav.run` (``cosyvoice/token2wav/runner.py``) executes the jobs of several streams as one flow
batch and one HiFT batch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from cosyvoice.flow.chunk_cache import FlowCacheManager
from cosyvoice.hift.stream import HiftStreamState

if TYPE_CHECKING:
    from cosyvoice.token2wav.runner import Token2Wav

__all__ = ["HopJob", "HopSchedule", "SpeakerPrompt", "Token2WavError", "Token2WavStream"]


class Token2WavError(ValueError):
    """Bad tokens, prompt or call order for a token2wav stream."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HopSchedule:
    first_hop: int = 25  # tokens; must equal the flow's attention chunk (50 frames) / token_mel_ratio
    max_hop: int = 100
    scale: int = 2
    lookahead: int = 3  # the flow's pre_lookahead_len

    def __post_init__(self) -> None:
        if self.first_hop < 1 or self.max_hop < self.first_hop or self.scale < 1 or self.lookahead < 0:
            raise Token2WavError(f"invalid hop schedule {self}")

    def prompt_pad(self, num_prompt_tokens: int) -> int:
        """Extra tokens of the first hop so that prompt + first hop is a multiple of ``first_hop``."""
        return math.ceil(num_prompt_tokens / self.first_hop) * self.first_hop - num_prompt_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeakerPrompt:
    """Flow conditioning of one request (from the frontend or a stored speaker record)."""

    prompt_token: torch.Tensor  # [P] int speech tokens of the prompt audio (P may be 0)
    prompt_feat: torch.Tensor  # [F, 80] float prompt mel, time-major (F = 2 P after frontend alignment)
    embedding: torch.Tensor  # [192] speaker x-vector

    def __post_init__(self) -> None:
        if self.prompt_token.dim() != 1 or self.prompt_token.is_floating_point():
            raise Token2WavError(
                f"prompt_token must be a 1-D int tensor, got {tuple(self.prompt_token.shape)}"
            )
        if self.prompt_feat.dim() != 2 or not self.prompt_feat.is_floating_point():
            raise Token2WavError(
                f"prompt_feat must be a float [F, mel] tensor, got {tuple(self.prompt_feat.shape)}"
            )
        if self.embedding.dim() != 1 or not self.embedding.is_floating_point():
            raise Token2WavError(f"embedding must be a 1-D float tensor, got {tuple(self.embedding.shape)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class HopJob:
    """One planned flow + HiFT call of a stream."""

    stream: Token2WavStream
    num_tokens: int  # tokens passed to the flow (look-ahead included)
    token_offset: int  # tokens whose mel was already emitted
    finalize: bool  # last call of the request: full attention, zero look-ahead, no withheld audio

    @property
    def streaming(self) -> bool:
        # upstream's closing call leaves streaming at its default False (final_pass "exact")
        return not self.finalize or self.stream.final_pass_streaming


class Token2WavStream:
    """Per-request state; create with :meth:`Token2Wav.stream`."""

    def __init__(
        self,
        owner: Token2Wav,
        prompt: SpeakerPrompt,
        *,
        stream: bool = True,
        share_prompt: bool = True,
        flow_cache: FlowCacheManager | None | bool = True,
        final_pass: str | None = None,
    ) -> None:
        self.owner = owner
        self.prompt = prompt
        self.is_streaming = stream
        self.tokens: list[int] = []
        self.token_offset = 0
        self.hop = owner.schedule.first_hop
        self.prompt_pad = owner.schedule.prompt_pad(int(prompt.prompt_token.shape[0]))
        self.vocoder = HiftStreamState(owner.hift, context_frames=owner.hift_context_frames)
        self.input_ended = False
        self.done = False
        self.hop_log: list[tuple[int, bool, bool, int]] = []  # (tokens, streaming, finalize, offset)
        # The closing call keeps the chunk mask (and so the cache): engine.final_pass "streaming".
        final_pass = owner.final_pass if final_pass is None else final_pass
        if final_pass not in ("exact", "streaming"):
            raise Token2WavError(f"final_pass must be 'exact' or 'streaming', got {final_pass!r}")
        self.final_pass_streaming = stream and final_pass == "streaming"
        # Complete flow chunks kept across hops (cosyvoice/flow/chunk_cache.py); None: recompute.
        manager = owner.flow_cache if flow_cache is True else flow_cache or None
        self.flow_cache = None
        if manager is not None and stream:
            self.flow_cache = manager.stream_cache(prompt if share_prompt else None)

    @property
    def this_hop(self) -> int:
        return self.hop + (self.prompt_pad if self.token_offset == 0 else 0)

    def add_tokens(self, tokens: Iterable[int] | torch.Tensor) -> None:
        """Append speech tokens (no compute)."""
        if self.input_ended:
            raise Token2WavError("tokens pushed after the end of input")
        raw = tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        try:
            values = [operator.index(t) for t in raw]
        except TypeError as exc:
            raise Token2WavError(f"speech tokens must be integers: {exc}") from exc
        vocab = self.owner.vocab_size
        bad = [t for t in values if not 0 <= t < vocab]
        if bad:
            raise Token2WavError(f"speech tokens must be ints in 0..{vocab - 1}, got {bad[:5]}")
        self.tokens.extend(values)

    def end_input(self) -> None:
        """Mark the token input complete (no compute)."""
        self.input_ended = True

    def next_hop_ready(self) -> bool:
        """Whether a streaming hop can run with the tokens known now."""
        return (
            self.is_streaming
            and not self.done
            and len(self.tokens) - self.token_offset >= self.this_hop + self.owner.schedule.lookahead
        )

    def next_job(self) -> HopJob | None:
        """The call this stream can run now: a ready hop, else the closing call once input ended."""
        if self.next_hop_ready():
            num = self.token_offset + self.this_hop + self.owner.schedule.lookahead
            return HopJob(stream=self, num_tokens=num, token_offset=self.token_offset, finalize=False)
        if self.input_ended and not self.done and self.tokens:
            return HopJob(
                stream=self, num_tokens=len(self.tokens), token_offset=self.token_offset, finalize=True
            )
        return None

    def push_tokens(self, tokens: Iterable[int] | torch.Tensor) -> list[torch.Tensor]:
        """Append tokens and run every hop that became ready; returns the new wave chunks ([n] float32)."""
        self.add_tokens(tokens)
        return self._drain()

    def finish(self) -> list[torch.Tensor]:
        """End the input and run what is left (ready hops, then the closing call)."""
        self.end_input()
        chunks = self._drain()
        if not self.tokens:
            self.done = True
        return chunks

    def close(self) -> None:
        """Give the stream's flow cache back to the budget (done, aborted or dropped); idempotent."""
        if self.flow_cache is not None:
            self.flow_cache.release()

    def _drain(self) -> list[torch.Tensor]:
        chunks = []
        while (job := self.next_job()) is not None:
            chunks.extend(self.owner.run([job]))
        return chunks

    def _apply(self, job: HopJob, new_mel: torch.Tensor) -> None:
        """Record a finished flow call: hand its mel [1, 80, m] to the vocoder state, advance the hop."""
        self.vocoder.append(new_mel)
        self._advance(job)

    def _advance(self, job: HopJob) -> None:
        """Record a finished call (its mel already with the vocoder state): advance the hop, or end."""
        self.hop_log.append((job.num_tokens, job.streaming, job.finalize, job.token_offset))
        if job.finalize:
            self.done = True
            self.close()
        else:
            self.token_offset += self.this_hop
            self.hop = min(self.owner.schedule.max_hop, self.hop * self.owner.schedule.scale)
