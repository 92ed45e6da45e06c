"""The shared half of token2wav: :class:`Token2Wav` holds the flow and the HiFT (no per-request state) and
runs the calls that streams plan (``cosyvoice/token2wav/stream.py``): several streams' jobs as one flow
batch and one HiFT batch (:meth:`Token2Wav.run`), or one job in slices that other work can go between
(:meth:`Token2Wav.begin_call`, :class:`PendingCall`)."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cosyvoice.config import CosyVoice3Config, load_config
from cosyvoice.flow import Flow
from cosyvoice.flow.chunk_cache import FlowCacheManager
from cosyvoice.flow.solve import FlowSolve
from cosyvoice.hift import CausalHift
from cosyvoice.hift.stream import vocode_streams
from cosyvoice.pretrained import load_flow, load_hift
from cosyvoice.token2wav.stream import HopJob, HopSchedule, SpeakerPrompt, Token2WavError, Token2WavStream

__all__ = ["PendingCall", "Token2Wav"]


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
