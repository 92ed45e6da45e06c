"""The first-audio floor model (scripts/first_audio_floor.py): its queue agrees with Erlang's M/D/1 result,
follow-up sentences are asked for at the first chunk before them, calls of several openings share the
LLM part, and the command prints its table and refuses bad figures."""

from __future__ import annotations

import pytest

from scripts import first_audio_floor as floor
from scripts.bench_traffic import percentile, poisson_arrivals


@pytest.mark.parametrize("rho", [0.2, 0.5])
def test_one_opening_a_call_and_one_sentence_a_reply_is_an_md1_queue(rho: float) -> None:
    service = 0.1
    arrivals = poisson_arrivals(60000, rho / service, seed=3)
    result = floor.simulate(arrivals, [1] * len(arrivals), lambda n: service * n, batch=1)
    for q in (0.5, 0.95, 0.99):
        expected = floor.md1_response_quantile(rho / service, service, q)
        got = percentile(result.first_chunk_s, 100 * q)
        assert got == pytest.approx(expected, rel=0.04, abs=0.002), q
    assert result.share() == pytest.approx(rho, rel=0.03)


def test_md1_quantiles_at_light_load_are_the_service_time_and_grow_with_load() -> None:
    assert floor.md1_response_quantile(0.01, 0.1, 0.95) == pytest.approx(0.1)  # nobody waits
    light, heavy = (floor.md1_response_quantile(rho / 0.1, 0.1, 0.95) for rho in (0.3, 0.6))
    assert 0.1 < light < heavy
    with pytest.raises(ValueError):
        floor.md1_response_quantile(12.0, 0.1, 0.95)  # rho 1.2: no steady state


def test_a_follow_up_sentence_is_asked_for_at_the_first_chunk_before_it() -> None:
    # one reply of three sentences at t=0 and one of one sentence at t=0.05; calls cost 0.1 s a row
    result = floor.simulate([0.0, 0.05], [3, 1], lambda n: 0.1 * n, batch=1)
    # reply 0's first (0 -> 0.1); reply 1 waited from 0.05 to 0.2; reply 0's second, asked at 0.1, runs
    # after it (0.2 -> 0.3: 0.2 s); its third, asked at 0.3, alone (0.1 s)
    assert result.first_chunk_s == pytest.approx([0.1, 0.15, 0.2, 0.1])
    assert result.busy_s == pytest.approx(0.4)


def test_waiting_openings_share_a_call_and_later_ones_wait_for_the_next() -> None:
    costs = {1: 0.10, 2: 0.15, 3: 0.20}
    # three requests while a call runs, one more during their call
    result = floor.simulate([0.0, 0.01, 0.02, 0.03, 0.12], [1] * 5, costs.__getitem__, batch=3)
    assert result.first_chunk_s == pytest.approx([0.1, 0.29, 0.28, 0.27, 0.28])
    with pytest.raises(ValueError):
        floor.simulate([0.0], [1], costs.__getitem__, batch=0)
    with pytest.raises(ValueError):
        floor.simulate([0.0], [0], costs.__getitem__, batch=1)


def test_calls_of_several_openings_lower_the_floor_of_the_bench_traffic() -> None:
    calls = floor.opening_calls(floor.OPENING_CALLS_MS)
    lone = floor.LONE_MS / 1000
    together = floor.floor_at(0.9, 14.9, lone, calls, 3000, 0, 2)
    alone = floor.floor_at(0.9, 14.9, lone, calls[:1], 3000, 0, 2)
    assert len(together.first_chunk_s) == len(alone.first_chunk_s) > 3000  # every sentence of every reply
    assert percentile(together.first_chunk_s, 95) < percentile(alone.first_chunk_s, 95)
    assert together.busy_s < alone.busy_s  # the LLM part paid once a call
    assert min(together.first_chunk_s) == pytest.approx(lone)  # nothing is faster than a lone opening


def test_opening_calls_interpolate_blanks_and_refuse_bad_lists() -> None:
    assert floor.opening_calls("47,78,,136") == pytest.approx([0.047, 0.078, 0.107, 0.136])
    assert floor.opening_calls("50") == pytest.approx([0.05])
    for bad in (",78", "47,", "47,-1", "x"):
        with pytest.raises(ValueError):
            floor.opening_calls(bad)


def test_the_command_prints_a_row_a_load_and_refuses_a_lone_below_one_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert floor.main(["--load", "0.3,0.6", "--replies", "400"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["0.30", "0.60"]
    p95_light, p95_heavy = float(rows[0][3]), float(rows[1][3])
    assert 1.0 <= p95_light <= p95_heavy
    with pytest.raises(SystemExit):
        floor.main(["--lone-ms", "40"])  # one opening's call alone is 47 ms
    with pytest.raises(SystemExit):
        floor.main(["--opening-calls-ms", "47,,"])


def test_other_work_that_cannot_pause_delays_only_requests_that_find_no_opening_running() -> None:
    # isolated requests, 10 s apart: each finds other work under way (other=1) and waits for the rest of
    # a 0.1 s unit, uniform in 0..0.1 s, before its 0.05 s call
    arrivals = [10.0 * k for k in range(4000)]
    result = floor.simulate(
        arrivals, [1] * len(arrivals), lambda n: 0.05, batch=1, other=1.0, unit_s=0.1, seed=5
    )
    assert 0.05 <= min(result.first_chunk_s) and max(result.first_chunk_s) <= 0.15 + 1e-9
    assert sum(result.first_chunk_s) / len(arrivals) == pytest.approx(0.1, rel=0.03)
    # a request that arrives while an opening call runs goes next, after no other work
    [first, second] = floor.simulate(
        [0.0, 0.01], [1, 1], lambda n: 0.05, batch=1, other=1.0, unit_s=0.0
    ).first_chunk_s
    assert (first, second) == pytest.approx((0.05, 0.09))
    unpaused = floor.simulate(arrivals, [1] * len(arrivals), lambda n: 0.05, batch=1, other=0.0, unit_s=0.1)
    assert unpaused.first_chunk_s == pytest.approx([0.05] * len(arrivals))
    with pytest.raises(ValueError):
        floor.simulate([0.0], [1], lambda n: 0.05, batch=1, other=1.5)


def test_the_other_share_is_the_busy_time_the_openings_leave() -> None:
    assert floor.other_share(0.5, 0.2) == pytest.approx(0.375)  # 0.3 of the 0.8 the openings leave
    assert floor.other_share(0.1, 0.2) == 0.0
    assert floor.other_share(1.0, 1.0) == 0.0


def test_with_busy_shares_the_command_adds_a_column_a_unit(capsys: pytest.CaptureFixture[str]) -> None:
    assert floor.main(["--load", "0.6", "--replies", "400", "--busy-pct", "52", "--unit-ms", "10,80"]) == 0
    header, row = capsys.readouterr().out.splitlines()[1:3]
    assert header.split()[-2:] == ["p95_x_unit_10ms", "p95_x_unit_80ms"]
    p95, short_units, long_units = (float(row.split()[i]) for i in (3, -2, -1))
    assert p95 <= short_units <= long_units
    with pytest.raises(SystemExit):
        floor.main(["--load", "0.3,0.6", "--busy-pct", "52"])  # one share a load


def test_an_llm_part_that_grows_with_the_rows_raises_the_floor(capsys: pytest.CaptureFixture[str]) -> None:
    calls = floor.opening_calls(floor.OPENING_CALLS_MS)
    lone = floor.LONE_MS / 1000
    once = floor.floor_at(0.6, 14.9, lone, calls, 2000, 0, 1)
    by_rows = floor.floor_at(0.6, 14.9, lone, calls, 2000, 0, 1, llm_scale=[1.0, 2.0])  # 2.0 from two rows on
    assert percentile(by_rows.first_chunk_s, 95) > percentile(once.first_chunk_s, 95)
    assert by_rows.busy_s > once.busy_s
    assert (
        floor.floor_at(0.6, 14.9, lone, calls, 2000, 0, 1, llm_scale=[1.0]).first_chunk_s
        == once.first_chunk_s
    )
    # one opening a call: the factor of two rows never applies
    alone = floor.floor_at(0.6, 14.9, lone, calls[:1], 2000, 0, 1)
    assert (
        floor.floor_at(0.6, 14.9, lone, calls[:1], 2000, 0, 1, llm_scale=[1.0, 2.0]).first_chunk_s
        == alone.first_chunk_s
    )
    assert floor.opening_calls("1,,1.5", unit=1) == pytest.approx([1.0, 1.25, 1.5])
    assert floor.main(["--load", "0.6", "--replies", "300", "--llm-scale", "1,1.3"]) == 0
    assert "LLM part x 1, 1.3" in capsys.readouterr().out
    for bad in ("1.2,1.5", "1,0.8"):
        with pytest.raises(SystemExit):
            floor.main(["--llm-scale", bad])
