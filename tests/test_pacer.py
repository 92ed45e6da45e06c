import pytest

from gateway.speech.pacer import Pacer


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def send_when_due(pacer: Pacer, clock: FakeClock, n: int) -> list[float]:
    times = []
    for _ in range(n):
        clock.t = max(clock.t, pacer.next_due())
        pacer.mark_sent()
        times.append(clock.t)
    return times


def test_prebuffer_then_real_time():
    clock = FakeClock()
    pacer = Pacer(frame_s=0.06, lead_frames=5, clock=clock)
    times = send_when_due(pacer, clock, 20)
    assert times[:5] == pytest.approx([100.0] * 5)
    gaps = [b - a for a, b in zip(times[4:], times[5:], strict=False)]
    assert gaps == pytest.approx([0.06] * len(gaps))
    # the device never holds more than the lead
    assert pacer.play_end - clock.t <= 5 * 0.06 + 1e-9


def test_not_before_delays_the_first_frame():
    clock = FakeClock()
    pacer = Pacer(frame_s=0.06, lead_frames=5, not_before=100.12, clock=clock)
    assert pacer.next_due() == pytest.approx(100.12)


def test_rebase_after_a_gap_does_not_burst_the_missed_time():
    clock = FakeClock()
    pacer = Pacer(frame_s=0.06, lead_frames=2, clock=clock)
    send_when_due(pacer, clock, 4)
    clock.t += 2.0  # synthesis stalled: the device ran dry
    times = send_when_due(pacer, clock, 6)
    # after the stall at most `lead` frames go at once, then one per frame period
    assert times[0] == pytest.approx(times[1])
    assert times[2] - times[1] == pytest.approx(0.06)
    assert pacer.underruns == 1


def test_stop_time_is_after_the_last_frame_plus_margin():
    clock = FakeClock()
    pacer = Pacer(frame_s=0.06, lead_frames=5, clock=clock)
    times = send_when_due(pacer, clock, 8)
    assert pacer.stop_time(0.42) == pytest.approx(times[-1] + 0.42)


def test_bad_arguments():
    with pytest.raises(ValueError):
        Pacer(frame_s=0)
    with pytest.raises(ValueError):
        Pacer(lead_frames=0)
