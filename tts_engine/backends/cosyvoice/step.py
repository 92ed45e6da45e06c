"""One CosyVoice3 scheduler step across many streams: a batched LLM step, then a batched token2wav hop.

1. LLM: requests already holding a KV cache slot decode one token together (``runner.decode_step``);
   new segments are prefilled together, at most the step budget's ``prefill_rows`` (the first ones in
   the engine's order; the rest wait a step, producing nothing). The engine's scheduler admits no more
   streams than there are KV slots and a stream holds at most one at a time, so a prefill always finds
   a free slot. Requests join and leave between steps; a finished or aborted request frees its slot
   at once.
2. The new speech tokens go to each request's token2wav stream (silent runs filtered).
3. The token2wav hops that are ready (25 -> 50 -> 100 tokens + 3 look-ahead, or the closing call) run in
   one batched flow + vocoder call (``Token2Wav.run``). The step budget's ``hop_rows`` caps the rows of
   that call: the streams come in the engine's slack order (first chunks and streams about to run dry first), so
   the hops of streams that are seconds ahead wait for a later step instead of delaying everyone's.

A batched call that raises is retried row by row where the rows' state allows it, so one bad request
does not fail its neighbours.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from cosyvoice.llm import LLMRequest
from cosyvoice.token2wav import HopJob, Token2Wav
from tts_engine.backends.cosyvoice.request import CosyVoiceStream
from tts_engine.budget import StepBudget

Errors = dict[int, BaseException]  # id(stream) -> what failed it


class BatchedStep:
    """Runs steps for the cosyvoice backend; ``runner`` is an ``LLMRunner`` (or a drop-in one)."""

    def __init__(self, runner: Any, token2wav: Token2Wav) -> None:
        self.runner = runner
        self.token2wav = token2wav
        self.num_hops_deferred = 0  # ready hops left for a later step by the budget's hop_rows
        self.num_prefills_deferred = 0  # prefills left for a later step by the budget's prefill_rows

    def run(
        self, streams: Sequence[CosyVoiceStream], errors: Errors, budget: StepBudget
    ) -> dict[int, torch.Tensor]:
        """Advance ``streams`` (in priority order) by one step within ``budget``; each stream's new
        audio by id."""
        self._llm_step(streams, errors, budget.prefill_rows)
        jobs: list[tuple[CosyVoiceStream, HopJob]] = []
        for stream in streams:
            if id(stream) in errors:
                continue
            try:
                stream.feed_tokens()
                job = stream.next_job()
            except Exception as exc:  # noqa: BLE001 - fails this request only
                errors[id(stream)] = exc
                continue
            if job is not None:
                jobs.append((stream, job))
        jobs, deferred = StepBudget.take(jobs, budget.hop_rows)
        self.num_hops_deferred += deferred
        return self._wave_step(jobs, errors)

    # -- LLM -----------------------------------------------------------------------------------

    def _llm_step(self, streams: Sequence[CosyVoiceStream], errors: Errors, prefill_rows: int | None) -> None:
        decode: list[tuple[CosyVoiceStream, LLMRequest]] = []
        prefill: list[tuple[CosyVoiceStream, LLMRequest]] = []
        for stream in streams:
            request = stream.llm_request()
            if request is not None:
                (prefill if request.slot is None else decode).append((stream, request))
        self._run_llm(self.runner.decode_step, decode, errors)
        prefill, deferred = StepBudget.take(prefill, prefill_rows)
        self.num_prefills_deferred += deferred
        self._run_llm(self.runner.prefill, prefill, errors)

    def _run_llm(
        self,
        call: Callable[[list[LLMRequest]], Any],
        items: list[tuple[CosyVoiceStream, LLMRequest]],
        errors: Errors,
    ) -> None:
        """One batched LLM call; on failure retry the rows it left untouched, one by one."""
        if not items:
            return
        before = [self._llm_state(request) for _, request in items]
        try:
            call([request for _, request in items])
            return
        except Exception as exc:  # noqa: BLE001 - sorted out per row below
            batch_error = exc
        for (stream, request), state in zip(items, before, strict=True):
            now = self._llm_state(request)
            if now[:2] != state[:2]:
                continue  # it got its token before the failure
            if now != state or len(items) == 1:
                errors[id(stream)] = batch_error  # its cache moved on without a token: cannot retry
                continue
            try:
                call([request])
            except Exception as exc:  # noqa: BLE001
                errors[id(stream)] = exc

    def _llm_state(self, request: LLMRequest) -> tuple[int, bool, int | None, int]:
        slot = request.slot
        length = self.runner.cache.length(slot) if slot is not None else -1
        return len(request.out_tokens), request.finished, slot, length

    # -- token2wav -----------------------------------------------------------------------------

    def _wave_step(
        self, jobs: list[tuple[CosyVoiceStream, HopJob]], errors: Errors
    ) -> dict[int, torch.Tensor]:
        """All given hops in one flow + vocoder batch; on failure retry the unchanged ones one by one."""
        chunks: dict[int, torch.Tensor] = {}
        if not jobs:
            return chunks
        t2w = self.token2wav
        try:
            for (stream, _), chunk in zip(jobs, t2w.run([job for _, job in jobs]), strict=True):
                chunks[id(stream)] = chunk
            return chunks
        except Exception as exc:  # noqa: BLE001 - sorted out per row below
            batch_error = exc
        for stream, job in jobs:
            if len(jobs) == 1 or job.stream.next_job() != job:
                errors[id(stream)] = batch_error  # its state moved on: cannot retry
                continue
            try:
                chunks[id(stream)] = t2w.run([job])[0]
            except Exception as exc:  # noqa: BLE001
                errors[id(stream)] = exc
        return chunks
