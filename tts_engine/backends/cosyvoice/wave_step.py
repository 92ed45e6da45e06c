"""The token2wav half of a CosyVoice3 scheduler step (``BatchedStep``, step.py): batched flow + vocoder
calls for the ready hops of one group of the step, their time shared out by hop kind (and an urgent
call's kept), and calls run a few Euler steps at a time (exact closing calls; on a CPU the short lane's
hops too, and with ``hop_slices``, off by default, the comfortable lane's), their vocoders, on a CPU, a
piece at a time (``vocoder_pieces``; the comfortable lane's hops too, their flow run whole). A batched
call that raises is retried row by row where the rows' state allows it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from cosyvoice.token2wav import HopJob, PendingCall, Token2Wav
from tts_engine.backends.cosyvoice.llm_step import Errors
from tts_engine.backends.cosyvoice.request import CosyVoiceStream
from tts_engine.backends.cosyvoice.timeline import Timeline, span_of
from tts_engine.budget import Lane, StepBudget

Chunks = dict[int, torch.Tensor]  # id(stream) -> its new audio
Stop = Callable[[], bool]  # true once a request arrived: the step's work that can wait ends there
CLOSING_SLICE = 2  # Euler steps a slice of a call run a few steps at a time (an exact closing call, a hop)
HOP_KINDS = ("opening", "hop", "closing")  # a segment's first hop; a later hop; its closing call


def never() -> bool:
    return False


def exact_closing(job: HopJob) -> bool:
    """An exact closing pass (full attention): it may run a slice at a time (``_slice``)."""
    return job.finalize and not job.streaming


def kind_of(job: HopJob) -> str:
    """``job``'s kind of ``HOP_KINDS``."""
    return "closing" if job.finalize else "opening" if job.token_offset == 0 else "hop"


def _kinds(jobs: list[tuple[CosyVoiceStream, HopJob]]) -> str:
    """A flow call's rows by kind for a timeline: O opening, H later hop, C closing (\"O1 H2\")."""
    kinds = [kind_of(job)[0].upper() for _, job in jobs]
    return " ".join(f"{kind}{kinds.count(kind)}" for kind in "OHC" if kind in kinds)


class WaveStepping:
    """The token2wav calls of ``BatchedStep`` (its ``token2wav``, time by kind and closing calls)."""

    token2wav: Token2Wav
    seconds: dict[str, float]  # where the step time went: "llm" and each of HOP_KINDS
    under_way: dict[int, tuple[CosyVoiceStream, PendingCall]]  # calls run a slice at a time, by id(stream)
    num_closing_pauses: int
    num_hop_slices: int
    num_yields: int
    num_hops_deferred: int
    # With it (on a CPU: rows_cost) a call run a slice at a time with a ``stop`` runs its vocoder a piece at
    # a time too (a resblock each, cosyvoice.hift.generator), a true ``stop()`` ending it between two
    # pieces (and between its flow's last slice and its vocoder): the vocoder is about half a hop's time
    # (a hop 58 ms whole, its vocoder 30 ms; a closing pass's vocoder up to 63 ms, run 51's machine), which
    # a newcomer otherwise waits for whole. The same operations: the same samples.
    vocoder_pieces: bool
    num_vocoder_pieces: int
    num_vocoder_pauses: int
    rows_left: int | None  # the step's hop rows left (None: no cap)
    advanced: set[int]  # streams whose flow call ran or advanced this step (id)
    call_seconds: dict[str, deque[float]]  # recent urgent calls' seconds a row: "opening" and "urgent"
    timeline: Timeline | None  # what each call ran and when (a benchmark's; None in a server)

    def _ready(
        self, streams: Sequence[tuple[CosyVoiceStream, Lane]], errors: Errors
    ) -> list[tuple[CosyVoiceStream, Lane, HopJob]]:
        """The streams whose next token2wav call can run now, with it (their new tokens handed over)."""
        ready: list[tuple[CosyVoiceStream, Lane, HopJob]] = []
        for stream, lane in streams:
            if id(stream) in errors:
                continue
            try:
                stream.feed_tokens()
                job = stream.next_job()
            except Exception as exc:  # noqa: BLE001 - fails this request only
                errors[id(stream)] = exc
                continue
            if job is not None:
                ready.append((stream, lane, job))
        return ready

    def _take(
        self, jobs: list[tuple[CosyVoiceStream, HopJob]], rows: int | None
    ) -> tuple[list[tuple[CosyVoiceStream, HopJob]], int | None]:
        """The first of ``jobs`` that fit the step's remaining hop rows, and the rows left after them."""
        taken, deferred = StepBudget.take(jobs, rows)
        self.num_hops_deferred += deferred
        self.rows_left = None if rows is None else rows - len(taken)
        return taken, self.rows_left

    def _under_way(self, stream: CosyVoiceStream, job: HopJob) -> bool:
        """``stream``'s call ``job`` has begun and runs a slice at a time."""
        entry = self.under_way.get(id(stream))
        return entry is not None and entry[1].job == job

    def _slice(
        self,
        stream: CosyVoiceStream,
        job: HopJob,
        errors: Errors,
        steps: int | None,
        stop: Stop = never,
        *,
        whole_flow: bool = False,
    ) -> torch.Tensor | None:
        """Advance ``stream``'s call ``job`` (begun now unless under way) by ``steps`` Euler steps (None:
        to its end, with a ``stop``: ``CLOSING_SLICE`` at a time until ``stop()`` turns true, unless
        ``whole_flow``), then, once its flow is done, its vocoder (with ``vocoder_pieces`` and a ``stop``,
        a piece at a time until ``stop()`` turns true); its audio once done. Sliced or whole, the same
        operations: the same samples."""
        kind = "closing" if exact_closing(job) else "slice"
        with span_of(self.timeline, kind, 1, "" if kind == "closing" else _kinds([(stream, job)])):
            return self._slice_call(stream, job, errors, steps, stop, whole_flow)

    def _slice_call(
        self, stream: CosyVoiceStream, job: HopJob, errors: Errors, steps: int | None, stop: Stop, whole_flow: bool
    ) -> torch.Tensor | None:
        t2w = self.token2wav
        started = time.perf_counter()
        try:
            if self._under_way(stream, job):
                pending = self.under_way[id(stream)][1]
            else:  # not begun, or a stale call (its stream moved on): begun anew
                pending = t2w.begin_call(job)
                self.under_way[id(stream)] = (stream, pending)
            self.advanced.add(id(stream))
            worked = not pending.done  # a unit of this call ran here (a stop() may end it after one)
            if worked and not self._advance_flow(t2w, pending, job, steps, never if whole_flow else stop):
                self.num_closing_pauses += exact_closing(job)
                return None
            if self.vocoder_pieces and stop is not never:
                while pending.samples is None:
                    if worked and stop():
                        self.num_vocoder_pauses += 1
                        return None  # a request arrived: the rest of the vocoder waits for a later step
                    worked = True
                    self.num_vocoder_pieces += not t2w.advance_vocoder(pending)
            del self.under_way[id(stream)]
            return t2w.finish_call(pending)
        except Exception as exc:  # noqa: BLE001 - fails this request only
            self.under_way.pop(id(stream), None)
            errors[id(stream)] = exc
            return None
        finally:
            self.seconds[kind_of(job)] += time.perf_counter() - started

    def _advance_flow(self, t2w: Token2Wav, pending: PendingCall, job: HopJob, steps: int | None, stop: Stop) -> bool:
        """Run ``steps`` of ``pending``'s Euler steps (None: to its end, with a ``stop`` ``CLOSING_SLICE`` at a
        time until ``stop()`` turns true); True once its flow is done."""
        to_end_by_slices = steps is None and stop is not never
        hop = not exact_closing(job)
        done = t2w.advance_call(pending, CLOSING_SLICE if to_end_by_slices else steps)
        self.num_hop_slices += hop and (steps is not None or to_end_by_slices)  # not a flow run whole
        while to_end_by_slices and not done and not stop():
            done = t2w.advance_call(pending, CLOSING_SLICE)
            self.num_hop_slices += hop
        return done

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
            kind = kind_of(job)
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

    def _timed_group(
        self, group: list[tuple[CosyVoiceStream, HopJob]], errors: Errors, stop: Stop = never
    ) -> Chunks:
        """One call of the urgent group (every closing pass whole; with a ``stop``, a slice at a time until
        it turns true), its time kept for ``_can_wait`` unless a row was left for a later step."""
        if not group:
            return {}
        started = time.perf_counter()
        chunks = self._wave_group(group, errors, whole=None, stop=stop)
        if any(id(stream) not in chunks and id(stream) not in errors for stream, _ in group):
            return chunks  # paused (``_pause``): not a whole call's time
        opening = all(job.token_offset == 0 for _, job in group)  # a call of openings (openings_per_call)
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
        slices: bool = False,
    ) -> Chunks:
        """One group of the slack order: its hops and the first ``whole`` of its exact closing calls (None:
        all) in one batch (``row_calls``: a call each); the other closing calls on their own,
        ``CLOSING_SLICE`` Euler steps a step (their audio once the last one ran), as is one already begun
        that way; a true ``stop()`` before a slice or a row's call leaves it and the rest for the next
        step. A group given a ``stop`` runs its whole closing calls on their own too (the short lane on a
        CPU: ``short_closings_yield``), a slice a call to their end unless ``stop()`` turns true between
        two slices. With ``slices`` (the short lane on a CPU, ``short_hop_slices``; the comfortable lane
        with ``hop_slices``) its hops run so too, in rank order with its closing calls; a hop begun so
        continues so in any group."""
        batched: list[tuple[CosyVoiceStream, HopJob]] = []
        sliced: list[tuple[CosyVoiceStream, HopJob, int | None]] = []
        whole_stops = stop is not never  # the short lane on a CPU (run); the comfortable lane has no whole ones
        closings = 0
        for stream, job in jobs:
            if not exact_closing(job):
                if slices or self._under_way(stream, job):
                    sliced.append((stream, job, None))
                else:
                    batched.append((stream, job))
                continue
            runs_whole = whole is None or closings < whole
            closings += 1
            if runs_whole and not self._under_way(stream, job) and not whole_stops:
                batched.append((stream, job))  # whole and not begun: in the batch, as the together order runs it
            else:
                sliced.append((stream, job, None if runs_whole else CLOSING_SLICE))
        if not slices:  # the batch's hops first, then the sliced closing calls (as before hop slices)
            sliced.sort(key=lambda row: exact_closing(row[1]))
        for stream, _ in batched:
            self.advanced.add(id(stream))
            self.under_way.pop(id(stream), None)  # a stale call (its stream moved on): it runs whole here
        if not row_calls:
            chunks = self._wave_step(batched, errors)
        else:
            chunks = {}
            for k, row in enumerate(batched):
                if k and stop():
                    self.num_yields += 1
                    return chunks  # a request arrived: the other rows and the slices wait for the next step
                if not self.vocoder_pieces:
                    chunks.update(self._wave_step([row], errors))
                    continue
                stream, job = row  # its flow whole, its vocoder a piece at a time (vocoder_pieces)
                chunk = self._slice(stream, job, errors, None, stop, whole_flow=True)
                if chunk is not None:
                    chunks[id(stream)] = chunk
                elif id(stream) in self.under_way:
                    self.num_yields += 1
                    return chunks  # stopped between two pieces: it and the rest wait for the next step
        for stream, job, steps in sliced:
            if stop():
                self.num_yields += 1
                break  # a request arrived: the other slices wait for the next step
            chunk = self._slice(stream, job, errors, steps, stop)
            if chunk is not None:
                chunks[id(stream)] = chunk
            elif steps is None and id(stream) in self.under_way:
                self.num_yields += 1
                break  # stopped between two slices: it and the rest wait for the next step
        return chunks
