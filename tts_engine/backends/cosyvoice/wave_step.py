"""The token2wav half of a CosyVoice3 scheduler step (``BatchedStep``, step.py): batched flow + vocoder
calls for the ready hops of one group of the step, their time shared out by hop kind (and an urgent
call's kept), and exact closing calls run a few Euler steps at a time. A batched call that raises is
retried row by row where the rows' state allows it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import torch

from cosyvoice.token2wav import HopJob, PendingClosing, Token2Wav
from tts_engine.backends.cosyvoice.llm_step import Errors
from tts_engine.backends.cosyvoice.request import CosyVoiceStream
from tts_engine.backends.cosyvoice.timeline import Timeline, span_of

Chunks = dict[int, torch.Tensor]  # id(stream) -> its new audio
Stop = Callable[[], bool]  # true once a request arrived: the step's work that can wait ends there
CLOSING_SLICE = 2  # Euler steps per engine step of an exact closing call whose stream has a comfortable lead
HOP_KINDS = ("opening", "hop", "closing")  # a segment's first hop; a later hop; its closing call


def never() -> bool:
    return False


def exact_closing(job: HopJob) -> bool:
    """An exact closing pass (full attention): it may run a slice at a time (``_closing_slice``)."""
    return job.finalize and not job.streaming


def _kinds(jobs: list[tuple[CosyVoiceStream, HopJob]]) -> str:
    """A flow call's rows by kind for a timeline: O opening, H later hop, C closing (\"O1 H2\")."""
    kinds = ["C" if job.finalize else "O" if job.token_offset == 0 else "H" for _, job in jobs]
    return " ".join(f"{kind}{kinds.count(kind)}" for kind in "OHC" if kind in kinds)


class WaveStepping:
    """The token2wav calls of ``BatchedStep`` (its ``token2wav``, time by kind and closing calls)."""

    token2wav: Token2Wav
    seconds: dict[str, float]  # where the step time went: "llm" and each of HOP_KINDS
    closings: dict[int, tuple[CosyVoiceStream, PendingClosing]]  # exact closing calls under way, by id(stream)
    num_closing_pauses: int
    num_yields: int
    closings_run: set[int]  # streams whose closing pass ran or advanced this step (id)
    call_seconds: dict[str, deque[float]]  # recent urgent calls' seconds a row: "opening" and "urgent"
    timeline: Timeline | None  # what each call ran and when (a benchmark's; None in a server)

    def _closing_slice(
        self, stream: CosyVoiceStream, job: HopJob, errors: Errors, steps: int | None, stop: Stop = never
    ) -> torch.Tensor | None:
        """Advance ``stream``'s exact closing call by ``steps`` Euler steps (None: to its end, with a
        ``stop``: ``CLOSING_SLICE`` at a time until ``stop()`` turns true); its last audio once done.
        Sliced or whole, the same operations: the same samples."""
        with span_of(self.timeline, "closing", 1):
            return self._closing_call(stream, job, errors, steps, stop)

    def _closing_call(
        self, stream: CosyVoiceStream, job: HopJob, errors: Errors, steps: int | None, stop: Stop
    ) -> torch.Tensor | None:
        t2w = self.token2wav
        started = time.perf_counter()
        try:
            entry = self.closings.get(id(stream))
            pending = entry[1] if entry is not None and entry[1].job == job else None
            if pending is None:
                pending = t2w.begin_closing(job)
                self.closings[id(stream)] = (stream, pending)
            to_end_by_slices = steps is None and stop is not never
            self.closings_run.add(id(stream))
            done = t2w.advance_closing(pending, CLOSING_SLICE if to_end_by_slices else steps)
            while to_end_by_slices and not done and not stop():
                done = t2w.advance_closing(pending, CLOSING_SLICE)
            if not done:
                self.num_closing_pauses += 1
                return None
            del self.closings[id(stream)]
            return t2w.finish_closing(pending)
        except Exception as exc:  # noqa: BLE001 - fails this request only
            self.closings.pop(id(stream), None)
            errors[id(stream)] = exc
            return None
        finally:
            self.seconds["closing"] += time.perf_counter() - started

    def _wave_step(self, jobs: list[tuple[CosyVoiceStream, HopJob]], errors: Errors) -> Chunks:
        """All given hops in one flow + vocoder batch (its time shared out by kind, ``seconds``)."""
        if not jobs:
            return {}
        started = time.perf_counter()
        try:
            with span_of(self.timeline, "flow", len(jobs), lambda: _kinds(jobs)):
                return self._wave_batch(jobs, errors)
        finally:
            self._account(jobs, time.perf_counter() - started)

    def _account(self, jobs: list[tuple[CosyVoiceStream, HopJob]], seconds: float) -> None:
        """Share a batch's time among its hop kinds by the frames each row computes (roughly)."""
        weights: dict[str, float] = dict.fromkeys(HOP_KINDS, 0.0)
        for _, job in jobs:
            kind = "closing" if job.finalize else "opening" if job.token_offset == 0 else "hop"
            prompt = int(job.stream.prompt.prompt_token.shape[0])
            weights[kind] += (
                prompt + job.num_tokens if not job.streaming else job.num_tokens - job.token_offset
            )
        total = sum(weights.values()) or 1.0
        for kind, weight in weights.items():
            self.seconds[kind] += seconds * weight / total

    def _wave_batch(self, jobs: list[tuple[CosyVoiceStream, HopJob]], errors: Errors) -> Chunks:
        """One flow + vocoder batch; on failure retry the unchanged hops one by one."""
        chunks: Chunks = {}
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

    def _timed_group(self, group: list[tuple[CosyVoiceStream, HopJob]], errors: Errors) -> Chunks:
        """One call of the urgent group (every closing pass whole), its time kept for ``_can_wait``."""
        if not group:
            return {}
        started = time.perf_counter()
        chunks = self._wave_group(group, errors, whole=None)
        opening = len(group) == 1 and group[0][1].token_offset == 0
        self.call_seconds["opening" if opening else "urgent"].append((time.perf_counter() - started) / len(group))
        return chunks

    def _wave_group(
        self,
        jobs: list[tuple[CosyVoiceStream, HopJob]],
        errors: Errors,
        *,
        whole: int | None,
        stop: Stop = never,
        row_calls: bool = False,
    ) -> Chunks:
        """One group of the slack order: its hops and the first ``whole`` of its exact closing calls (None:
        all) in one batch (``row_calls``: a call each); the other closing calls on their own,
        ``CLOSING_SLICE`` Euler steps a step (their audio once the last one ran), as is one already begun
        that way; a true ``stop()`` before a slice or a row's call leaves it and the rest for the next
        step. A group given a ``stop`` runs its whole closing calls on their own too (the short lane on a
        CPU: ``short_closings_yield``), a slice a call to their end unless ``stop()`` turns true between
        two slices."""
        batched = [(stream, job) for stream, job in jobs if not job.finalize or job.streaming]
        sliced: list[tuple[CosyVoiceStream, HopJob, int | None]] = []
        closing = [(stream, job) for stream, job in jobs if exact_closing(job)]
        whole_stops = stop is not never  # the short lane on a CPU (run); the comfortable lane has no whole ones
        for k, (stream, job) in enumerate(closing):
            runs_whole = whole is None or k < whole
            if runs_whole and id(stream) not in self.closings and not whole_stops:
                batched.append((stream, job))  # whole and not begun: in the batch, as the together order runs it
            else:
                sliced.append((stream, job, None if runs_whole else CLOSING_SLICE))
        self.closings_run.update(id(stream) for stream, job in batched if job.finalize)
        if not row_calls:
            chunks = self._wave_step(batched, errors)
        else:
            chunks = {}
            for k, row in enumerate(batched):
                if k and stop():
                    self.num_yields += 1
                    return chunks  # a request arrived: the other rows and the slices wait for the next step
                chunks.update(self._wave_step([row], errors))
        for stream, job, steps in sliced:
            if stop():
                self.num_yields += 1
                break  # a request arrived: the other slices wait for the next step
            chunk = self._closing_slice(stream, job, errors, steps, stop)
            if chunk is not None:
                chunks[id(stream)] = chunk
            elif steps is None and id(stream) in self.closings:
                self.num_yields += 1
                break  # stopped between two slices: it and the rest wait for the next step
        return chunks
