"""The urgent group of a CosyVoice3 slack-order step (``BatchedStep``, step.py) on a device where a flow
call costs in proportion to its rows (``rows_cost``, a CPU): which flow calls it makes, in rank order
(opening hops next to each other in rank order together, up to ``openings_per_call``, the other rows
between two such calls together), and which urgent rows
have slack to spare and run after the step's openings (``_can_wait``), from recent calls' durations.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping

from cosyvoice.token2wav import HopJob
from tts_engine.backends.cosyvoice.request import CosyVoiceStream
from tts_engine.backends.cosyvoice.wave_step import Stop, exact_closing, never

WAIT_MARGIN = 2.0  # an urgent row waits for openings only with this many times their estimated cost to spare
CALL_WINDOW = 16  # urgent flow calls whose durations make the estimates (the longest time a row; openings apart)


class UrgentCalls:
    """The urgent group's calls of ``BatchedStep`` (its ``rows_cost`` and recent urgent calls' seconds a
    row, ``call_seconds``)."""

    rows_cost: bool
    call_seconds: dict[str, deque[float]]  # "opening" and "urgent": the last CALL_WINDOW calls' seconds a row
    num_urgent_waits: int
    num_opening_calls: int
    # With it (and rows_cost) an urgent call's exact closing passes run CLOSING_SLICE Euler steps at a
    # time, and once a request has arrived the rest of them waits for the next step where every row of
    # the call could still wait for the newcomer's opening (``_pause``). Run 37 found the slowest first
    # chunks at load 0.6 waiting behind urgent closing passes run whole (223-428 ms).
    urgent_closing_pauses = True
    num_urgent_pauses = 0  # urgent calls' closing passes left for a later step so
    # With it an urgent call none of whose rows could wait even as it begins runs whole, its closing
    # passes batched with its hops (as before the pauses): its slack only shrinks, so no pause could
    # come. Runs 39 and 40 found up to nine such closing passes at load 0.9 run a slice at a time.
    urgent_pause_precheck = True
    # Two paired A/Bs of 1.0 against 2.0 (seeds 4000 and 5000) disagreed at load 0.6: 2.0 stays.
    wait_margin = WAIT_MARGIN  # times the openings' estimated cost an urgent row must have to spare to wait
    # Opening hops that follow each other in rank order (no other urgent row between) share a call, this
    # many at most: a CPU's one-row opening costs 47 ms, two together 78, four 136 (tiny preset, 1 thread),
    # so the last listener of a cluster hears sooner and the first later, and the engine does less work.
    # Paired A/B of 4 against 1 (eight rounds, seed 11000): the lower p95 in five rounds of eight at loads
    # 0.6 and 0.9, pooled 201 against 206 ms and 257 against 264 ms, 1 against 2 and 7 against 14
    # underruns, the engine less busy at 0.9 in seven rounds (docs/step-order.md, item 2).
    openings_per_call = 4
    # With it the cached opening hops of a run of openings next to each other in rank order go out before
    # the one-call sentences' (a sentence shorter than the first hop: its only call is the exact closing
    # pass, the prompt and every token at full attention) and never in one call with them: the flow solves
    # such rows in a call apart anyway, longest first (cosyvoice/flow/incremental.py::row_groups), so
    # the cached openings' listeners waited for it (run 47: a call of two openings and one such sentence,
    # 280 ms, against 120-138 ms for two or three openings). Off: its paired A/B gained at load 0.6 and
    # lost at 0.9, and the two Poisson runs after it were worse than the one before (docs/step-order.md,
    # item 2).
    openings_cheap_first = False
    num_one_call_after = 0  # one-call sentences' passes that went out after the cached openings beside them so

    def _pause(
        self,
        group: list[tuple[CosyVoiceStream, HopJob]],
        yielding: Stop,
        slack: Mapping[int, float] | None,
        started: float,
        lead_in: float,
    ) -> Stop:
        """The ``stop`` of an urgent call (``_wave_group``): with ``urgent_closing_pauses``, where the call
        has exact closing passes, true once a request has arrived (``yielding``) while every row of the
        call can still wait for one opening after ``lead_in`` s (``_can_wait``); else, or where they cannot
        even now (``urgent_pause_precheck``), ``never`` (the call runs whole, as it did)."""
        if not (self.urgent_closing_pauses and self.rows_cost and slack is not None):
            return never
        if not any(exact_closing(job) for _, job in group):
            return never
        if self.urgent_pause_precheck and len(self._can_wait(group, slack, started, 1, lead_in)) < len(group):
            return never

        def stop() -> bool:
            if not yielding() or len(self._can_wait(group, slack, started, 1, lead_in)) < len(group):
                return False
            self.num_urgent_pauses += 1
            return True

        return stop

    def _can_wait(
        self,
        rows: list[tuple[CosyVoiceStream, HopJob]],
        slack: Mapping[int, float] | None,
        started: float,
        openings: int,
        lead_in: float = 0.0,
    ) -> set[int]:
        """The non-opening rows (by id of stream) whose slack left covers their own call (all of them in one
        batch) and ``wait_margin`` times ``openings`` opening calls after ``lead_in`` seconds, each call
        estimated by the longest recent one (an urgent call by its longest time a row); none without
        ``rows_cost``, slack or estimates."""
        seconds = self.call_seconds
        if not self.rows_cost or slack is None or not openings or not all(seconds.values()):
            return set()
        own = max(seconds["urgent"]) * sum(job.token_offset != 0 for _, job in rows)
        wait = own + self.wait_margin * (lead_in + openings * max(seconds["opening"]))
        left = slack.get  # slack at the plan, less the time since
        elapsed = time.perf_counter() - started
        return {
            id(stream)
            for stream, job in rows
            if job.token_offset != 0 and (left(id(stream)) or 0.0) - elapsed > wait
        }

    def _urgent_calls(
        self, first: list[tuple[CosyVoiceStream, HopJob]], waits: set[int]
    ) -> tuple[list[list[tuple[CosyVoiceStream, HopJob]]], list[tuple[CosyVoiceStream, HopJob]]]:
        """The urgent group's flow calls: one batch; or, with ``rows_cost``, in rank order (least
        slack first), opening hops (the first audio of waiting listeners) next to each other in calls of up
        to ``openings_per_call`` rows, each before the rest (with ``openings_cheap_first``, of those next to
        each other the cached openings first, then the one-call sentences' exact passes, never in one
        call), and the other rows between two such calls batched together; and the rows of ``waits``
        (streams with slack to spare, ``_can_wait``), batched after the last opening."""
        if not self.rows_cost or len(first) < 2 or not any(job.token_offset == 0 for _, job in first):
            return [first], []
        calls: list[list[tuple[CosyVoiceStream, HopJob]]] = []
        batch: list[tuple[CosyVoiceStream, HopJob]] = []
        after = [(stream, job) for stream, job in first if id(stream) in waits]
        self.num_urgent_waits += len(after)
        run: list[tuple[CosyVoiceStream, HopJob]] = []  # openings next to each other in rank order

        def end_run() -> None:
            parts = [run]
            if self.openings_cheap_first:
                parts = [
                    [row for row in run if not exact_closing(row[1])],
                    [row for row in run if exact_closing(row[1])],
                ]
                self.num_one_call_after += len(parts[1]) if parts[0] else 0
            for part in parts:
                for k in range(0, len(part), self.openings_per_call):
                    calls.append(part[k : k + self.openings_per_call])
                    self.num_opening_calls += 1
            run.clear()

        for stream, job in first:
            if id(stream) in waits:
                continue
            if job.token_offset != 0:
                end_run()
                batch.append((stream, job))
                continue
            if batch:
                calls.append(batch)
                batch = []
            run.append((stream, job))
        end_run()
        return calls + ([batch] if batch else []), after
