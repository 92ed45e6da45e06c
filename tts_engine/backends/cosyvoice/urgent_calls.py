"""The urgent group of a CosyVoice3 slack-order step (``BatchedStep``, step.py) on a device where a flow
call costs in proportion to its rows (``rows_cost``, a CPU): which flow calls it makes, in rank order
(each opening hop alone, the other rows between two openings together), and which urgent rows
have slack to spare and run after the step's openings (``_can_wait``), from recent calls' durations.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping

from cosyvoice.token2wav import HopJob
from tts_engine.backends.cosyvoice.request import CosyVoiceStream

WAIT_MARGIN = 2.0  # an urgent row waits for openings only with this many times their estimated cost to spare
CALL_WINDOW = 16  # urgent flow calls whose durations make the estimates (the longest time a row; openings apart)


class UrgentCalls:
    """The urgent group's calls of ``BatchedStep`` (its ``rows_cost`` and recent urgent calls' seconds a
    row, ``call_seconds``)."""

    rows_cost: bool
    call_seconds: dict[str, deque[float]]  # "opening" and "urgent": the last CALL_WINDOW calls' seconds a row
    num_urgent_waits: int
    num_openings_alone: int

    def _can_wait(
        self,
        rows: list[tuple[CosyVoiceStream, HopJob]],
        slack: Mapping[int, float] | None,
        started: float,
        openings: int,
        lead_in: float = 0.0,
    ) -> set[int]:
        """The non-opening rows (by id of stream) whose slack left covers their own call (all of them in one
        batch) and ``WAIT_MARGIN`` times ``openings`` opening calls after ``lead_in`` seconds, each call
        estimated by the longest recent one (an urgent call by its longest time a row); none without
        ``rows_cost``, slack or estimates."""
        seconds = self.call_seconds
        if not self.rows_cost or slack is None or not openings or not all(seconds.values()):
            return set()
        own = max(seconds["urgent"]) * sum(job.token_offset != 0 for _, job in rows)
        wait = own + WAIT_MARGIN * (lead_in + openings * max(seconds["opening"]))
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
        slack first), each opening hop (the first audio of a waiting listener) in a call of its own and the
        other rows between two openings batched together; and the rows of ``waits`` (streams with slack to
        spare, ``_can_wait``), batched after the last opening."""
        if not self.rows_cost or len(first) < 2 or not any(job.token_offset == 0 for _, job in first):
            return [first], []
        calls: list[list[tuple[CosyVoiceStream, HopJob]]] = []
        batch: list[tuple[CosyVoiceStream, HopJob]] = []
        after = [(stream, job) for stream, job in first if id(stream) in waits]
        self.num_urgent_waits += len(after)
        for stream, job in first:
            if id(stream) in waits:
                continue
            if job.token_offset != 0:
                batch.append((stream, job))
                continue
            if batch:
                calls.append(batch)
                batch = []
            calls.append([(stream, job)])
            self.num_openings_alone += 1
        return calls + ([batch] if batch else []), after
