"""One CosyVoice3 scheduler step across many streams: a batched LLM step, then batched token2wav hops.

1. LLM: requests already holding a KV cache slot decode one token together (``runner.decode_step``);
   new segments are prefilled together, at most the step budget's ``prefill_rows`` (the first ones in
   the engine's order; the rest wait a step, producing nothing). The engine's scheduler admits no more
   streams than there are KV slots and a stream holds at most one at a time, so a prefill always finds
   a free slot. Requests join and leave between steps; a finished or aborted request frees its slot
   at once (a parked one moves it to host memory, ``LLMRunner.swap_out``).
2. The new speech tokens go to each request's token2wav stream (silent runs filtered).
3. The token2wav hops that are ready (25 -> 50 -> 100 tokens + 3 look-ahead, or the closing call) run as
   batched flow + vocoder calls (``Token2Wav.run``). The step budget's ``hop_rows`` caps their rows,
   taken in the engine's order (least playback slack first), so the hops of streams that are seconds
   ahead wait for a later step instead of delaying everyone's.

Step order (``order``): ``"slack"`` (the default) orders the step by the budget's lanes
(tts_engine/budget.py): decode bursts for every stream waiting for an opening hop and every urgent one
whose next hop lacks tokens (``_decode_burst``; on a CPU, ``bursts_yield``, a request arriving meanwhile
ends it between two iterations; with ``bursts_split``, off by default, it ends at the first opening's
tokens and the step after that opening's audio); then every opening hop and the urgent streams' hops in
one group, whose audio is handed out (``emit``) at once (on a CPU the opening hops in calls of their
own, up to four a call, their audio out before the group's other rows run: ``rows_cost``, and urgent
rows with slack to spare after the openings: ``_can_wait``; urgent_calls.py); then, unless a request
arrived meanwhile (``should_yield``: the rest waits a step), the short lane's tokens and hops (on a CPU
its hops and exact closing calls a few Euler steps a call, a new request ending them between two:
``short_hop_slices``, ``short_closings_yield``); then the later hops and closing passes of streams with
a comfortable lead (exact closing passes a few Euler steps a step; with ``hop_slices``, off by default,
the hops a few Euler steps a slice to their end, a new request ending them between two slices; a step a
request ended before any short or comfortable row advanced still runs one slice of the first:
``closing_progress``; on a CPU every call run so, and the comfortable lane's hops run a row a call, run
their vocoder a piece at a time, a new request ending it between two: ``vocoder_pieces``); then an LLM
catch-up for every running LLM (``_catch_up``). While another
listener waits for first audio, the comfortable work of the deferred lane waits until the step's
openings are out (``deferred_after_openings``; an opening that could not run this step holds it for a
later one), and a batch stream's hops wait for a later step. ``"together"`` is the order before: one
token a step, one batch of every ready hop, its audio handed out when the step ends. The order decides
when a hop runs, with which rows and in how many slices, never what it computes
(tests/test_step_order.py compares the audio bit for bit).

A batched call that raises is retried row by row where the rows' state allows it, so one bad request
does not fail its neighbours (wave_step.py has the token2wav calls, llm_step.py the LLM's).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from cosyvoice.token2wav import HopJob, PendingCall, Token2Wav
from tts_engine.backends.cosyvoice.llm_step import BURST_RIDERS, Errors, LLMStepping
from tts_engine.backends.cosyvoice.request import CosyVoiceStream
from tts_engine.backends.cosyvoice.timeline import Timeline, span_of
from tts_engine.backends.cosyvoice.urgent_calls import CALL_WINDOW, UrgentCalls
from tts_engine.backends.cosyvoice.wave_step import (
    CLOSING_SLICE,
    HOP_KINDS,
    Chunks,
    Stop,
    WaveStepping,
    exact_closing,
    never,
)
from tts_engine.budget import Lane, StepBudget
from tts_engine.errors import EngineError

Emit = Callable[[Chunks], bool]  # hands audio out mid-step; False: it could not (keep it for the end)
STEP_ORDERS = ("slack", "together")
DECODE_BURST = 32  # extra decode iterations a step may run for streams whose audio is due (_decode_burst)
SHORT_WHOLE_CLOSINGS = 1  # exact closing calls of the short lane run whole per step; the rest by slices
_NO_AUDIO = np.zeros(0, dtype=np.float32)


def _opens(stream: CosyVoiceStream, lane: Lane) -> bool:
    """Its next audio is an opening hop that may run this step (not a batch stream held back)."""
    return lane != Lane.BACKGROUND and stream.awaits_opening


def _lanes(streams: Sequence[tuple[CosyVoiceStream, Lane]]) -> str:
    """A step's streams by lane for a timeline (\"URGENT 2 SHORT 1\")."""
    lanes = [lane for _, lane in streams]
    return " ".join(f"{lane.name} {lanes.count(lane)}" for lane in Lane if lane in lanes)


class BatchedStep(LLMStepping, WaveStepping, UrgentCalls):
    """Runs steps for the cosyvoice backend; ``runner`` is an ``LLMRunner`` (or a drop-in one)."""

    def __init__(
        self,
        runner: Any,
        token2wav: Token2Wav,
        *,
        order: str = "slack",
        decode_burst: int = DECODE_BURST,
        rows_cost: bool = False,
    ) -> None:
        if order not in STEP_ORDERS:
            raise ValueError(f"step order must be one of {', '.join(STEP_ORDERS)}, got {order!r}")
        self.runner = runner
        self.token2wav = token2wav
        self.order = order
        self.num_hops_deferred = 0  # ready hops left for a later step by the budget's hop_rows
        self.num_hops_held = 0  # ready hops left for a later step by their lane (someone waits for audio)
        self.num_prefills_deferred = 0  # prefills left for a later step by the budget's prefill_rows
        self.seconds = {"llm": 0.0, **{kind: 0.0 for kind in HOP_KINDS}}  # where the step time went
        # calls under way a slice at a time ("slack" order: exact closing calls, with hop_slices hops too):
        # id(stream) -> (stream, its solve)
        self.under_way: dict[int, tuple[CosyVoiceStream, PendingCall]] = {}
        self.num_closing_pauses = 0  # slices after which an exact closing call waited for a later step
        self.num_llm_held = 0  # LLM rows that waited a step (held streams that have their next hop's tokens)
        self.decode_burst = decode_burst
        self.num_burst_decodes = 0  # extra decode iterations run by _decode_burst
        self.num_burst_rows = 0  # ... and their rows
        self.burst_riders = BURST_RIDERS  # other streams' LLM rows decoded along each burst iteration
        self.num_burst_riders = 0  # ... rows of those
        self.num_bursts_cut = 0  # bursts ended early for a request that arrived meanwhile (_decode_burst)
        # ... which a request arriving mid-burst does when True: on a CPU (rows_cost). A paired A/B of eight
        # rounds, the cut with bursts_split (LLMStepping) against neither: the lower p95 in five rounds of
        # eight at loads 0.6 and 0.9, pooled 203 against 245 ms and 251 against 312 ms, 0 against 7 and 5
        # against 22 underruns; a second, the split against the cut alone, favoured the cut alone (pooled
        # 200 against 188 ms and 240 against 226 ms), so the split stays off (docs/step-order.md, item 1).
        # Off on a GPU: not measured there.
        self.bursts_yield = rows_cost
        self.num_bursts_split = 0  # bursts ended at their first opening's tokens (bursts_split)
        # With it a deferred stream's later hops and closing pass (its lead comfortable while a listener
        # waits for first audio) run as the comfortable lane's do once the step's openings are out, instead
        # of waiting for a step nobody waits in: under steady arrivals there was none, and held closing
        # passes reached the urgent lane together and ran whole in one call (a Poisson run at load 0.6:
        # five in 1409 ms, ahead of the next openings). An A/B at load 0.6, four rounds: first-chunk p95
        # 349 against 413 ms, 4 against 13 underruns (docs/step-order.md, item 5).
        self.deferred_after_openings = True
        self.num_catch_up_decodes = 0  # decode iterations run by _catch_up
        self.num_catch_up_rows = 0  # ... and their rows
        self.timeline: Timeline | None = None  # a benchmark's record of each call (timeline.py)
        self.num_yields = 0  # steps ended after their urgent audio for a request that arrived meanwhile
        # A flow call costs in proportion to its rows (a CPU: tiny preset, 1 thread, one opening 44.9 ms, two
        # together 77.9 ms). Then, in the slack order, each opening hop of the urgent group runs in a call
        # of its own, its audio out before the group's other rows run, and the comfortable group's hops
        # run a row a call, a new request ending them between two calls: a waiting listener is kept
        # behind no one else's rows. On a GPU a call's fixed cost dominates (an eager one-row hop: 213 ms
        # on an H200) and one batch serves everyone sooner. The backend sets it by device.
        self.rows_cost = rows_cost
        self.num_opening_calls = 0  # calls of opening hops apart from the other urgent rows (rows_cost)
        # With rows_cost the short lane's exact closing calls run apart from its hops, a slice a call, a
        # new request ending them between two (a probe at load 0.6 found the slowest first chunks waiting
        # 150-200 ms behind a short hop and a closing call run whole, 93-141 ms). A short lane's lead
        # outlasts the longest recent step, so it can wait one.
        self.short_closings_yield = rows_cost
        # With rows_cost, an urgent row (a hop or closing pass of a stream whose lead is under the longest
        # recent step) whose slack still covers its own call plus wait_margin times the openings' calls
        # (each at the longest time a row of the last CALL_WINDOW calls, openings apart) runs after the
        # step's opening hops; and when a request arrives before it runs and its slack also covers a
        # newcomer's opening, the step ends first. A probe at load 0.6 found most of the slowest first
        # chunks waiting behind urgent hops and closing passes (67-339 ms) of streams with more lead.
        self.call_seconds: dict[str, deque[float]] = {
            kind: deque(maxlen=CALL_WINDOW) for kind in ("opening", "urgent")
        }
        self.num_urgent_waits = 0  # urgent rows that ran after a step's openings, having slack to spare
        # With it a step in which no exact closing pass of the short or comfortable lane advanced (a new
        # request ended it first, as under steady arrivals nearly every step is) still runs one slice of
        # the first such pass in rank order, after its urgent audio is out: held passes otherwise reach
        # the urgent lane together and run whole, ahead of the next openings. Two A/Bs on one engine
        # (loads 0.6 and 0.9, three rounds each): a lower first-chunk p95 in four rounds of six at
        # each load, fewer underruns in all (docs/step-order.md, item 5).
        self.closing_progress = True
        self.num_progress_slices = 0  # ... slices run so
        self.advanced: set[int] = set()  # streams whose flow call ran or advanced this step (id)
        # With it the comfortable lane's hops run CLOSING_SLICE Euler steps at a time, a new request ending
        # them between two slices, and closing_progress takes short hops too. Off: three A/Bs on a CPU found
        # no steady gain (docs/step-order.md, item 5).
        self.hop_slices = False
        # With it (and short_closings_yield: a CPU) the short lane's hops run so too, a new request ending
        # them between two slices: a newcomer otherwise waits for a short hop run whole (69-73 ms in run 45).
        # A paired A/B: a lower first-chunk p95 in 4 of 6 rounds at load 0.6, 5 of 6 at 0.9 (item 4).
        self.short_hop_slices = True
        self.num_hop_slices = 0  # Euler-step slices of hops run so
        self.vocoder_pieces = rows_cost  # (WaveStepping) a CPU: sliced calls' vocoders a piece at a time
        self.num_vocoder_pieces = 0  # vocoder pieces run so (all but each call's last)
        self.num_vocoder_pauses = 0  # ... and calls left between two of them for a later step
        self.progress: list[tuple[CosyVoiceStream, HopJob]] = []  # the step's candidates for _progress
        self.rows_left: int | None = None  # the step's hop rows left (None: no cap)

    def set_rows_cost(self, on: bool) -> None:
        """Override the backend's choice by device: ``rows_cost``, ``short_closings_yield``, ``bursts_yield``
        and ``vocoder_pieces`` (a benchmark's A/B)."""
        self.rows_cost = self.short_closings_yield = self.bursts_yield = self.vocoder_pieces = on

    def run(
        self,
        streams: Sequence[tuple[CosyVoiceStream, Lane]],
        errors: Errors,
        budget: StepBudget,
        emit: Emit | None = None,
        should_yield: Stop | None = None,
        slack: Mapping[int, float] | None = None,
    ) -> Chunks:
        """Advance ``streams`` (in rank order, each with its lane) by one step within ``budget``; each
        stream's new audio by id (the audio ``emit`` handed out mid-step is not in it). Once the urgent
        audio is out, a true ``should_yield()`` (a request arrived meanwhile) ends the step there: the
        short and comfortable lanes' work waits for the next step, which starts with the newcomer's
        prefill and opening hop (a short lane stays safe: its lead is longer than the longest recent
        step, or it would be urgent). ``slack``: each stream's playback slack when the step was planned,
        by id (with ``rows_cost``, urgent rows with slack to spare wait for the openings)."""
        with span_of(self.timeline, "step", len(streams), lambda: _lanes(streams)):
            self.advanced.clear()
            self.progress.clear()
            self.rows_left = budget.hop_rows
            yields = self.num_yields
            chunks = self._run(streams, errors, budget, emit, should_yield, slack)
            self.num_yields = yields + (self.num_yields > yields)  # a step once, however many of its calls stopped
            if self.closing_progress and (self.rows_left is None or self.rows_left > 0):
                chunks.update(self._progress(errors))
            return chunks

    def _progress(self, errors: Errors) -> Chunks:
        """One slice of the first of the step's short and comfortable rows ``_progresses`` takes (rank order)
        where none of them advanced this step (``closing_progress``); its audio once it ends (its vocoder
        whole: under steady arrivals, with every step ending early, a piece a step would hold its audio for
        as many steps as the vocoder has pieces)."""
        candidates = [(s, job) for s, job in self.progress if id(s) not in errors and not s.closed and s.next_job() == job]
        if not candidates or any(id(s) in self.advanced for s, _ in candidates):
            return {}
        stream, job = candidates[0]
        self.num_progress_slices += 1
        chunk = self._slice(stream, job, errors, CLOSING_SLICE)
        return {} if chunk is None else {id(stream): chunk}

    def _run(
        self,
        streams: Sequence[tuple[CosyVoiceStream, Lane]],
        errors: Errors,
        budget: StepBudget,
        emit: Emit | None,
        should_yield: Stop | None,
        slack: Mapping[int, float] | None,
    ) -> Chunks:
        for key, (stream, _) in list(self.under_way.items()):
            if stream.closed:
                del self.under_way[key]  # finished, failed or aborted meanwhile
        yielding = should_yield or never
        started = time.perf_counter()
        self._llm_step(streams, errors, budget.prefill_rows)
        bursts = self.order == "slack" and budget.lanes is not None  # lanes: a scheduler ranks the streams
        riders = [(s, lane) for s, lane in streams if lane != Lane.BACKGROUND]  # not a batch request while one waits
        burst_stop = yielding if self.bursts_yield else None
        splits = self.num_bursts_split
        if bursts:  # tokens for every waiting opening hop and every critical stream
            candidates = [s for s, lane in streams if lane == Lane.URGENT or _opens(s, lane)]
            self._decode_burst(candidates, errors, riders, burst_stop)
        self.seconds["llm"] += time.perf_counter() - started
        waves_started = time.perf_counter()
        ready = self._ready(streams, errors)
        if self.order == "together":
            jobs, deferred = StepBudget.take([(stream, job) for stream, _, job in ready], budget.hop_rows)
            self.num_hops_deferred += deferred
            return self._wave_step(jobs, errors)
        first: list[tuple[CosyVoiceStream, HopJob]] = []
        later: list[tuple[CosyVoiceStream, HopJob, bool]] = []  # the comfortable work; True: deferred
        for stream, lane, job in ready:
            opening = job.token_offset == 0
            if lane == Lane.BACKGROUND:
                self.num_hops_held += 1
            elif lane == Lane.URGENT or opening:
                first.append((stream, job))
            elif lane != Lane.SHORT:
                later.append((stream, job, lane == Lane.DEFERRED))
        rows = budget.hop_rows
        ran = {id(stream) for stream, _ in first}  # one call a stream a step
        first, rows = self._take(first, rows)
        self.progress += [
            (stream, job) for stream, lane, job in ready if lane == Lane.SHORT and self._progresses(job, True)
        ]  # and the comfortable lane's, below (once its deferred rows are known)
        chunks: Chunks = {}
        openings = sum(job.token_offset == 0 for _, job in first)
        # a burst split at its first opening (bursts_split): the step ends after the openings that ran
        split = self.num_bursts_split > splits and openings > 0
        calls, after = self._urgent_calls(first, self._can_wait(first, slack, started, openings))
        lead_in = waves_started - started
        for group in calls:
            chunks.update(self._timed_group(group, errors, self._pause(group, yielding, slack, started, lead_in)))
            chunks = self._emit(chunks, emit)
        second = self._comfortable(later, streams, errors)  # the step's openings are out
        self.progress += [(stream, job) for stream, job in second if self._progresses(job, False)]
        if after and (split or yielding()):  # a newcomer: its opening first if these can wait for it too
            if len(self._can_wait(after, slack, started, 1, lead_in)) == len(after):
                self.num_yields += not split
                return chunks
        chunks.update(self._timed_group(after, errors, self._pause(after, yielding, slack, started, lead_in)))
        chunks = self._emit(chunks, emit)
        if split or yielding():
            self.num_yields += not split
            return chunks
        # the short lane, once the urgent audio is out: its tokens (a burst where needed), then its hops
        started = time.perf_counter()
        short_lane = [s for s, lane in streams if lane == Lane.SHORT and id(s) not in errors and id(s) not in ran]
        if bursts:
            self._decode_burst(short_lane, errors, riders, burst_stop)
        self.seconds["llm"] += time.perf_counter() - started
        short = [(stream, job) for stream, _, job in self._ready([(s, Lane.SHORT) for s in short_lane], errors)]
        short, rows = self._take(short, rows)
        stop_short = yielding if self.short_closings_yield else never
        slices = self.short_hop_slices and self.short_closings_yield  # a GPU: its hops batched, whole
        chunks.update(self._wave_group(short, errors, whole=SHORT_WHOLE_CLOSINGS, stop=stop_short, slices=slices))
        chunks = self._emit(chunks, emit)
        if second and yielding():
            self.num_yields += 1
            return chunks
        second, rows = self._take(second, rows)
        chunks.update(
            self._wave_group(second, errors, whole=0, stop=yielding, row_calls=self.rows_cost, slices=self.hop_slices)
        )
        if bursts and not yielding():
            started = time.perf_counter()
            self._catch_up(
                [s for s, lane in streams if lane != Lane.BACKGROUND], errors, started - waves_started, yielding
            )
            self.seconds["llm"] += time.perf_counter() - started
        return chunks

    def _progresses(self, job: HopJob, short: bool) -> bool:
        """A row ``closing_progress`` may advance: an exact closing call; with ``hop_slices`` a short hop."""
        return exact_closing(job) or (self.hop_slices and short)

    def _comfortable(
        self,
        later: list[tuple[CosyVoiceStream, HopJob, bool]],
        streams: Sequence[tuple[CosyVoiceStream, Lane]],
        errors: Errors,
    ) -> list[tuple[CosyVoiceStream, HopJob]]:
        """The comfortable lane's rows that run this step, in rank order: the deferred ones too once every
        opening of the step is out (``deferred_after_openings``), else they wait for a later step."""
        waits = not self.deferred_after_openings or any(
            _opens(s, lane) and id(s) not in errors for s, lane in streams
        )
        held = sum(deferred for _, _, deferred in later) if waits else 0
        self.num_hops_held += held
        return [(stream, job) for stream, job, deferred in later if not (deferred and waits)]

    @staticmethod
    def _emit(chunks: Chunks, emit: Emit | None) -> Chunks:
        """Hand ``chunks`` out now if there is a way to (what is left to return at the step's end)."""
        if chunks and emit is not None and emit(chunks):
            return {}
        return chunks

    def step_streams(
        self,
        owner: object,
        streams: Sequence[Any],
        budget: StepBudget,
        on_chunks: Callable[[list[tuple[int, Any]]], None] | None = None,
        should_yield: Stop | None = None,
    ) -> list[np.ndarray | None | BaseException]:
        """The backend's ``step()``: ``owner``'s open, unparked streams run one step in their lanes (any
        other is failed alone), each given its audio, ``None`` at its end, or its error, in order;
        ``on_chunks`` gets the urgent lane's audio mid-step, by index in ``streams``; ``should_yield``:
        see ``run``."""
        errors: dict[int, BaseException] = {}
        mine: list[tuple[CosyVoiceStream, Lane]] = []
        for index, stream in enumerate(streams):
            if isinstance(stream, CosyVoiceStream) and stream.owner is owner and not stream.closed:
                if stream.parked:
                    errors[id(stream)] = EngineError("a parked stream was stepped")
                else:
                    mine.append((stream, budget.lane(index)))
            else:
                errors[id(stream)] = EngineError("stream is closed or belongs to another backend")
        emit = None
        emitted: set[int] = set()  # streams whose audio went out mid-step: their end comes next step
        if on_chunks is not None:
            index_of = {id(stream): i for i, stream in enumerate(streams)}

            def emit(chunks: dict[int, torch.Tensor]) -> bool:
                emitted.update(chunks)
                on_chunks([(index_of[key], chunk.detach()) for key, chunk in chunks.items()])
                return True

        slack = None if budget.slack is None else dict(zip(map(id, streams), budget.slack, strict=True))
        chunks = self.run(mine, errors, budget, emit, should_yield, slack)
        results: list[np.ndarray | None | BaseException] = []
        for stream in streams:
            error = errors.get(id(stream))
            if error is not None:
                results.append(error)
            elif id(stream) in emitted:
                results.append(_NO_AUDIO)  # as in "together" order, where its last chunk and its end
            else:  # come in separate steps (the end waits for the buffer bound like every step does)
                try:
                    results.append(stream.take(chunks.get(id(stream))))
                except Exception as exc:  # noqa: BLE001
                    results.append(exc)
        return results
