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
:meth:`Token2Wav.run` executes the jobs of several streams as one flow batch and one HiFT batch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cosyvoice.config import CosyVoice3Config, load_config
from cosyvoice.flow import Flow
from cosyvoice.flow.chunk_cache import FlowCacheManager
from cosyvoice.flow.solve import FlowSolve
from cosyvoice.hift import CausalHift
from cosyvoice.hift.stream import HiftStreamState, vocode_streams
from cosyvoice.pretrained import load_flow, load_hift

__all__ = [
    "HopJob",
    "HopSchedule",
    "PendingCall",
    "SpeakerPrompt",
    "Token2Wav",
    "Token2WavError",
    "Token2WavStream",
]


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


class Token2Wav:
    """Shared flow + HiFT; holds no per-request state."""

    def __init__(
        self,
        flow: Flow,
        hift: CausalHift,
        *,
        schedule: HopSchedule | None = None,
        full_revocode: bool = False,
        flow_cache: FlowCacheManager | None = None,
        final_pass: str = "exact",
    ) -> None:
        if final_pass not in ("exact", "streaming"):
            raise Token2WavError(f"final_pass must be 'exact' or 'streaming', got {final_pass!r}")
        self.flow = flow
        # Per-voice prompt prefixes and per-stream chunk caches of the flow; None: every hop recomputes.
        self.flow_cache = flow_cache
        # "exact": the closing call is upstream's full-attention pass over everything; "streaming": it
        # keeps the chunk mask, so with a cache it computes only its new frames (output differs a little).
        self.final_pass = final_pass
        self.hift = hift
        # Upstream re-vocodes every accumulated frame each hop; a window of the vocoder's receptive field
        # gives the same samples (see cosyvoice.hift.stream) at a bounded cost per hop.
        self.hift_context_frames = None if full_revocode else hift.left_context_frames()
        self.schedule = schedule or HopSchedule(lookahead=flow.cfg.pre_lookahead_len)
        self.vocab_size = flow.cfg.vocab_size
        self.token_mel_ratio = flow.cfg.token_mel_ratio
        if self.schedule.lookahead != flow.cfg.pre_lookahead_len:
            raise Token2WavError("hop schedule look-ahead differs from the flow's pre_lookahead_len")

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        *,
        config: CosyVoice3Config | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_seconds: float | None = None,
    ) -> Token2Wav:
        config = config or load_config(model_dir)
        flow = load_flow(config, device=device, dtype=dtype)
        hift = load_hift(config, device=device, dtype=dtype, max_seconds=max_seconds)
        streaming = config.streaming
        schedule = HopSchedule(
            first_hop=streaming.token_hop_len,
            max_hop=streaming.token_max_hop_len,
            scale=streaming.stream_scale_factor,
            lookahead=config.flow.pre_lookahead_len,
        )
        return cls(flow, hift, schedule=schedule)

    def stream(
        self,
        prompt: SpeakerPrompt,
        *,
        stream: bool = True,
        share_prompt: bool = True,
        flow_cache: FlowCacheManager | None | bool = True,
        final_pass: str | None = None,
    ) -> Token2WavStream:
        """A new request. ``stream=False`` makes it offline: nothing runs before :meth:`~Token2WavStream.finish`.

        ``share_prompt``: ``prompt`` is a voice's lasting object, so its voice-only flow chunks may be
        cached for every stream given the same object (False for one-off prompts). ``flow_cache``: the
        manager whose budget this stream's chunks use (True: this object's ``flow_cache``; None or
        False: no cache); ``final_pass``: None for this object's setting.
        """
        return Token2WavStream(
            self, prompt, stream=stream, share_prompt=share_prompt, flow_cache=flow_cache, final_pass=final_pass
        )

    def offline(self, tokens: Iterable[int] | torch.Tensor, prompt: SpeakerPrompt) -> torch.Tensor:
        """The whole waveform [n] of a complete token list in one full-attention pass."""
        stream = self.stream(prompt, stream=False)
        stream.add_tokens(tokens)
        chunks = stream.finish()
        return chunks[0] if chunks else torch.zeros(0)

    @torch.inference_mode()
    def run(self, jobs: Sequence[HopJob]) -> list[torch.Tensor]:
        """Execute one job per stream as one flow batch and one HiFT batch; returns each job's new samples."""
        if not jobs:
            return []
        streams = [job.stream for job in jobs]
        if len({id(s) for s in streams}) != len(streams) or any(s.owner is not self for s in streams):
            raise Token2WavError("run() takes at most one job per stream, all created by this Token2Wav")
        if any(job.stream.next_job() != job for job in jobs):
            raise Token2WavError("stale job: the stream's state changed since next_job()")
        mels = self._flow_batch(jobs)  # one [1, 80, m] per job, frames after 2 * token_offset
        for job, mel in zip(jobs, mels, strict=True):
            job.stream._apply(job, mel)
        return vocode_streams(self.hift, [job.stream.vocoder for job in jobs], [job.finalize for job in jobs])

    # -- one call in slices (the engine runs other streams' work between them) -------------------------

    @torch.inference_mode()
    def begin_call(self, job: HopJob) -> PendingCall:
        """``job`` (a hop or a closing call) as a flow solve to advance a few Euler steps at a time
        (:meth:`advance_call`) and then vocode (:meth:`finish_call`): the same operations as
        ``run([job])``, so the same samples, however it is sliced."""
        if job.stream.owner is not self or job.stream.next_job() != job:
            raise Token2WavError("stale job: the stream's state changed since next_job()")
        return PendingCall(job, self.flow.begin_inference(**self._flow_args([job]), **self._cache_args([job])))

    def advance_call(self, pending: PendingCall, steps: int | None = None) -> bool:
        """Run ``steps`` more of its Euler steps (None: the rest); True once its flow is done."""
        return self.flow.advance_inference(pending.solve, steps)

    @torch.inference_mode()
    def advance_vocoder(self, pending: PendingCall) -> bool:
        """Run one piece of a call's vocoder (a few ms on a CPU; :meth:`CausalHift.pieces`), begun with the
        first once its flow is done; True once the vocoder has ended (its samples: :meth:`finish_call`).
        The stream's state changes only with the last piece, so a call left between two pieces is still
        its stream's next job, and the pieces compute what ``run([job])`` does."""
        if pending.samples is not None:
            return True
        job = pending.job
        if pending.vocoding is None:
            if job.stream.next_job() != job:
                raise Token2WavError("stale job: the stream's state changed since begin_call()")
            if not pending.solve.done:
                raise Token2WavError("the call's vocoder began before its flow was done")
            [new_mel] = self._cut(self.flow.finish_inference(pending.solve), [job])
            pending.vocoding = self._vocode_pieces(job, new_mel)
        try:
            next(pending.vocoding)
        except StopIteration as end:
            pending.samples = end.value
            pending.vocoding = None
            return True
        return False

    def _vocode_pieces(self, job: HopJob, new_mel: torch.Tensor) -> Generator[None, None, torch.Tensor]:
        samples = yield from job.stream.vocoder.vocode_pieces(self.hift, new_mel, finalize=job.finalize)
        job.stream._advance(job)
        return samples

    def finish_call(self, pending: PendingCall) -> torch.Tensor:
        """Vocode a done call (what :meth:`advance_vocoder` has not run yet); its stream's new samples."""
        while not self.advance_vocoder(pending):
            pass  # one piece each: the same operations as a call of the whole vocoder
        assert pending.samples is not None
        return pending.samples

    def _flow_batch(self, jobs: Sequence[HopJob]) -> list[torch.Tensor]:
        # Host tensors: the flow checks the ids on the host and copies them to its device itself.
        mel = self.flow.inference(**self._flow_args(jobs), **self._cache_args(jobs))  # [B, 80, M]
        return self._cut(mel, jobs)

    def _cache_args(self, jobs: Sequence[HopJob]) -> dict:
        """The rows' flow caches (None where no row has one) and the output frames each already has."""
        caches = [job.stream.flow_cache for job in jobs] if any(j.stream.flow_cache for j in jobs) else None
        return {"caches": caches, "skip_frames": [self.token_mel_ratio * job.token_offset for job in jobs]}

    def _flow_args(self, jobs: Sequence[HopJob]) -> dict:
        prompts = [job.stream.prompt for job in jobs]
        batch = len(jobs)
        n_max = max(job.num_tokens for job in jobs)
        p_lens = [int(p.prompt_token.shape[0]) for p in prompts]
        f_lens = [int(p.prompt_feat.shape[0]) for p in prompts]
        token = torch.zeros(batch, n_max, dtype=torch.int32)  # [B, N]
        prompt_token = torch.zeros(batch, max(p_lens), dtype=torch.int32)  # [B, P]
        prompt_feat = torch.zeros(batch, max(f_lens), prompts[0].prompt_feat.shape[1])  # [B, F, 80]
        for b, (job, prompt) in enumerate(zip(jobs, prompts, strict=True)):
            token[b, : job.num_tokens] = torch.tensor(job.stream.tokens[: job.num_tokens], dtype=torch.int32)
            prompt_token[b, : p_lens[b]] = prompt.prompt_token
            prompt_feat[b, : f_lens[b]] = prompt.prompt_feat
        embedding = torch.stack([p.embedding.float().cpu() for p in prompts])  # [B, 192]
        return {
            "token": token, "token_len": [job.num_tokens for job in jobs], "prompt_token": prompt_token,
            "prompt_token_len": p_lens, "prompt_feat": prompt_feat, "prompt_feat_len": f_lens,
            "embedding": embedding, "streaming": [job.streaming for job in jobs],
            "finalize": [job.finalize for job in jobs],
        }  # fmt: skip

    def _cut(self, mel: torch.Tensor, jobs: Sequence[HopJob]) -> list[torch.Tensor]:
        """Each job's new frames [1, 80, m] of a flow call's mel [B, 80, M] (after 2 * token_offset)."""
        p_lens = [int(job.stream.prompt.prompt_token.shape[0]) for job in jobs]
        f_lens = [int(job.stream.prompt.prompt_feat.shape[0]) for job in jobs]
        lens = self.flow.mel_lengths([job.num_tokens for job in jobs], p_lens, f_lens, [j.finalize for j in jobs])
        ratio = self.token_mel_ratio
        return [mel[b : b + 1, :, ratio * job.token_offset : lens[b]] for b, job in enumerate(jobs)]


@dataclass(eq=False)
class PendingCall:
    """A hop or closing call under way (:meth:`Token2Wav.begin_call`)."""

    job: HopJob
    solve: FlowSolve
    vocoding: Generator[None, None, torch.Tensor] | None = None  # its vocoder under way (advance_vocoder)
    samples: torch.Tensor | None = None  # its new samples once the vocoder ended

    @property
    def done(self) -> bool:
        """Its flow is done (the vocoder may not have begun)."""
        return self.solve.done
