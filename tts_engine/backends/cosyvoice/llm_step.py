"""The LLM half of a CosyVoice3 scheduler step (``BatchedStep``, step.py): one batched decode for every
stream, prefills within the budget, decode bursts for streams whose audio is due, and the catch-up
after a step's flow work. Sampling is per request (its own CPU generator), so how tokens are batched or
when they are drawn never changes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from cosyvoice.llm import LLMRequest
from tts_engine.backends.cosyvoice.request import CosyVoiceStream
from tts_engine.backends.cosyvoice.timeline import Timeline, span_of
from tts_engine.budget import Lane, StepBudget

Errors = dict[int, BaseException]  # id(stream) -> what failed it
CATCH_UP_SHARE = 0.5  # decode time after a step's flow work, at most this share of that work's time
# Other streams whose LLM still runs ride along each burst iteration, at most this many (rank order): a
# row costs ~0.2-0.4 ms in a batched decode against 1.1-1.6 ms in an iteration of its own (tiny preset,
# 1 thread), and at load 0.6 the catch-up decoded 1.7 rows an iteration, bursts 1.0-1.2: 30 % of the
# engine's time went to the LLM. Riders delay the burst's own rows (a newcomer's 27 iterations: 39 ms with
# three rows, 71 ms with six, run 46). Paired A/B of 2 against 4 (five rounds, seed 17000): the lower p95
# in three rounds of five at loads 0.6 and 0.9, fewer underruns at both (docs/step-order.md, item 1).
BURST_RIDERS = 2


class LLMStepping:
    """The LLM calls of ``BatchedStep`` (its ``runner``, ``order``, ``decode_burst`` and counters)."""

    runner: Any
    order: str
    decode_burst: int
    num_llm_held: int
    num_prefills_deferred: int
    num_burst_decodes: int
    num_burst_rows: int
    num_burst_riders: int
    num_bursts_cut: int
    burst_riders: int
    # With it a stream with a comfortable lead (its lane COMFORTABLE or DEFERRED) rides along a burst
    # iteration only while its own next hop lacks tokens; one whose next hop is ready gets its later tokens
    # from the step's decode and catch-up. Urgent and short streams always ride. A rider adds ~0.3-0.4 ms
    # to each of a newcomer's ~27 burst iterations (tiny preset, 1 thread). Off: its paired A/B was even
    # (docs/step-order.md, item 1), and one letting every stream ride only while short of tokens gained at
    # load 0.6 and lost at 0.9 (the playing streams' LLMs fell behind).
    riders_need_tokens = False
    # With it a burst ends once an opening among its rows has its hop's tokens (and every other urgent row
    # its), and the step ends after that opening's audio (``BatchedStep._run``): the openings still short
    # of tokens burst on in the next step instead of the first listener waiting for their tokens too. A
    # newcomer that ended another's burst (``bursts_yield``) bursts along with it that far and then
    # waits for that one opening only. Off: against the cut alone its paired A/B lost at load 0.9 in six
    # rounds of eight and was even at 0.6 (docs/step-order.md, item 1).
    bursts_split = False
    num_bursts_split: int
    num_catch_up_decodes: int
    num_catch_up_rows: int
    timeline: Timeline | None  # what each call ran and when (a benchmark's; None in a server)

    def _llm_step(
        self, streams: Sequence[tuple[CosyVoiceStream, Lane]], errors: Errors, prefill_rows: int | None
    ) -> None:
        """Decode (and prefill) every stream's LLM; in the slack order a held stream's LLM waits too when
        its next hop's tokens are already there (a batch stream's always), so a step while a listener waits
        for first audio decodes only the rows that need tokens."""
        decode: list[tuple[CosyVoiceStream, LLMRequest]] = []
        prefill: list[tuple[CosyVoiceStream, LLMRequest]] = []
        for stream, lane in streams:
            request = stream.llm_request()
            if request is None:
                continue
            if self.order == "slack" and lane >= Lane.DEFERRED:
                if lane == Lane.BACKGROUND or stream.next_job() is not None:
                    self.num_llm_held += 1
                    continue
            (prefill if request.slot is None else decode).append((stream, request))
        prefill, deferred = StepBudget.take(prefill, prefill_rows)
        self.num_prefills_deferred += deferred
        with span_of(self.timeline, "llm", len(decode) + len(prefill), lambda: f"prefill {len(prefill)}"):
            self._run_llm(self.runner.decode_step, decode, errors)
            self._run_llm(self.runner.prefill, prefill, errors)

    def _catch_up(
        self,
        streams: Sequence[CosyVoiceStream],
        errors: Errors,
        wave_seconds: float,
        stop: Callable[[], bool],
    ) -> None:
        """After a step's flow work: decode iterations for every stream whose LLM still runs, for up to
        ``CATCH_UP_SHARE`` of the time the flow work took. One token a step would fall behind real time
        (25 tokens a second of audio) once steps run other streams' hops for more than 40 ms, and a
        stream holds its KV cache slot until its LLM finishes; the rows are batched, so the tokens cost
        little each. A true ``stop()`` (a request arrived) ends it."""
        if wave_seconds <= 0:
            return
        deadline = time.perf_counter() + CATCH_UP_SHARE * wave_seconds
        before, rows_before = self.num_catch_up_decodes, self.num_catch_up_rows
        with span_of(
            self.timeline, "catch-up", 0,
            lambda: f"{self.num_catch_up_decodes - before} iterations, {self.num_catch_up_rows - rows_before} rows",
        ):  # fmt: skip
            self._catch_up_iterations(streams, errors, deadline, stop)

    def _catch_up_iterations(
        self, streams: Sequence[CosyVoiceStream], errors: Errors, deadline: float, stop: Callable[[], bool]
    ) -> None:
        for _ in range(self.decode_burst):
            rows = [
                (stream, request)
                for stream in streams
                if id(stream) not in errors and (request := stream.llm_request()) is not None and request.slot is not None
            ]
            if not rows or time.perf_counter() >= deadline or stop():
                return  # done, out of time, or a request arrived: its step comes first
            self._run_llm(self.runner.decode_step, rows, errors)
            self.num_catch_up_decodes += 1
            self.num_catch_up_rows += len(rows)

    def _decode_burst(
        self,
        candidates: Sequence[CosyVoiceStream],
        errors: Errors,
        riders: Sequence[tuple[CosyVoiceStream, Lane]] = (),
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """More decode iterations in this step for ``candidates`` whose next hop still lacks tokens (a
        batch of the rows still short per iteration, at most ``decode_burst`` iterations). One token a
        step is too slow when a step also runs other streams' flow work (a 50-80 ms hop against a 1.4 ms
        decode on the tiny CPU model): a newcomer's 28 opening tokens would take 28 such steps, and a
        playing stream falls behind real time. Sampling is per request (its own generator): the same
        tokens whenever they are drawn. Up to ``burst_riders`` of ``riders`` (other streams whose LLM
        still runs, in rank order) are decoded in the same iterations: their tokens are due anyway, and
        a row in a batch costs a fraction of an iteration of its own. They never lengthen the burst.
        A true ``stop()`` (a device or interactive request arrived) ends the burst between two
        iterations: the next step prefills the newcomer and its burst decodes the newcomer's tokens with
        the rest of these (a row costs a fraction of an iteration), where it would otherwise wait for
        this burst, the openings after it and then a burst of its own (``num_bursts_cut``)."""
        if not candidates:
            return
        before, rows_before = self.num_burst_decodes, self.num_burst_rows + self.num_burst_riders
        with span_of(
            self.timeline, "burst", len(candidates),
            lambda: f"{self.num_burst_decodes - before} iterations, "
            f"{self.num_burst_rows + self.num_burst_riders - rows_before} rows",
        ):  # fmt: skip
            self._burst_iterations(candidates, errors, riders, stop)

    def _burst_iterations(
        self,
        candidates: Sequence[CosyVoiceStream],
        errors: Errors,
        riders: Sequence[tuple[CosyVoiceStream, Lane]],
        stop: Callable[[], bool] | None,
    ) -> None:
        for _ in range(self.decode_burst):
            rows: list[tuple[CosyVoiceStream, LLMRequest]] = []
            for stream in candidates:
                request = stream.llm_request()
                if id(stream) in errors or request is None or request.slot is None:
                    continue
                if _short_of_tokens(stream, errors):
                    rows.append((stream, request))
            if not rows:
                return
            if self.bursts_split and _an_opening_ready(candidates, rows, errors):
                self.num_bursts_split += 1
                return
            if stop is not None and stop():
                self.num_bursts_cut += 1
                return
            extra = self._riders(riders, rows, errors)
            self._run_llm(self.runner.decode_step, rows + extra, errors)
            self.num_burst_decodes += 1
            self.num_burst_rows += len(rows)
            self.num_burst_riders += len(extra)

    def _riders(
        self,
        riders: Sequence[tuple[CosyVoiceStream, Lane]],
        rows: list[tuple[CosyVoiceStream, LLMRequest]],
        errors: Errors,
    ) -> list[tuple[CosyVoiceStream, LLMRequest]]:
        """The first ``burst_riders`` of ``riders`` (with their lanes) with a running LLM that are not in
        ``rows`` (with ``riders_need_tokens``, a comfortable one only while its next hop lacks tokens)."""
        taken = {id(stream) for stream, _ in rows}
        extra: list[tuple[CosyVoiceStream, LLMRequest]] = []
        for stream, lane in riders:
            if len(extra) >= self.burst_riders:
                break
            request = stream.llm_request()
            if id(stream) in taken or id(stream) in errors or request is None or request.slot is None:
                continue
            if self.riders_need_tokens and lane >= Lane.COMFORTABLE and not _short_of_tokens(stream, errors):
                continue  # its next hop has its tokens (or it failed)
            extra.append((stream, request))
        return extra

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


def _short_of_tokens(stream: CosyVoiceStream, errors: Errors) -> bool:
    """``stream``'s next hop still lacks tokens once its new ones are handed over; False, with the error in
    ``errors``, when that fails (it fails this request only)."""
    try:
        stream.feed_tokens()
        return stream.next_job() is None
    except Exception as exc:  # noqa: BLE001 - fails this request only
        errors[id(stream)] = exc
        return False


def _an_opening_ready(
    candidates: Sequence[CosyVoiceStream], rows: list[tuple[CosyVoiceStream, LLMRequest]], errors: Errors
) -> bool:
    """Every row still short of tokens (``rows``) waits for its opening hop, and some other of
    ``candidates`` waits for its opening hop and has its tokens (``bursts_split``)."""
    if not all(stream.awaits_opening for stream, _ in rows):
        return False  # a playing stream's urgent hop still lacks tokens
    short = {id(stream) for stream, _ in rows}
    return any(
        s.awaits_opening and id(s) not in short and id(s) not in errors and s.next_job() is not None
        for s in candidates
    )
