"""Server-side AEC against device models (scripts/aec_devices.py), offline (issue 23, item 10).

An independent test drove xiaozhi-sdk with `features.aec`, protocol v1: frames arrive
ahead of time into the device's queue and play one per 60 ms tick, and each tick the uplink
carries the frame being played, scaled by 0.5 or 0.25, and nothing else. That echo is up
to a frame ahead of our play-time model (a microphone frame would leave once captured), and
the reply was cut by a false barge-in 3 times out of 3. With no echo at all, real speech
barged in 2-3 s late: AEC3 ducks the user wherever we play until its filter has converged,
and with nothing to converge on it never does.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from scripts.aec_devices import MODELS, Trial, arrivals, play_starts
from scripts.aec_sim import onsets, simulate_device
from scripts.speech import utterance

REPLY_TEXTS = [
    "This is a long story that keeps going for quite a while.",
    "Once upon a time there was a small robot who liked to sing.",
    "It sang every morning, and the birds sang back to it.",
]


@pytest.fixture(scope="module")
def reply() -> np.ndarray:
    return utterance(REPLY_TEXTS, lead_s=0.1, gap_s=0.3, tail_s=0.2).pcm  # ~8.5 s


def sdk_device(gain: float, *, version: int = 1) -> Trial:
    """The issue's device on a LAN: what it sends is its echo ~50 ms ahead of our model."""
    model = MODELS["sdk-plain-v1" if version == 1 else "sdk-plain-v2"]
    return Trial(model, gain_db=20 * math.log10(gain), down_ms=4.0, up_ms=5.0, lead_in_ms=1000.0, seed=3)


@pytest.mark.parametrize("version", [1, 2], ids=["v1", "v2-timestamps"])
@pytest.mark.parametrize("gain", [0.5, 0.25])
def test_plain_echo_of_the_frame_being_played_is_no_barge_in(reply, gain, version):
    result = simulate_device(reply, sdk_device(gain, version=version))
    assert result.true_delays_ms.max() < 0  # the echo leads our play-time model
    assert onsets(result.out) == []  # the reply plays on
    assert result.canceller.delay_ms == pytest.approx(float(np.median(result.true_delays_ms)), abs=2)
    played = slice(int((result.reply_start_s + 3) * 16000), int(result.reply_start_s * 16000) + reply.size)
    kept = np.sum(result.out[played].astype(np.float64) ** 2) / np.sum(
        result.mic[played].astype(np.float64) ** 2
    )
    assert 10 * np.log10(kept) < -25  # and cancelled


@pytest.mark.parametrize("at_s", [2.5, 4.2])
def test_speech_on_a_clean_uplink_barges_in_at_once(reply, at_s):
    # the same device playing through headphones (or cancelling its own echo): the microphone
    # hears the user alone, 2.5 or 4.2 s into the reply. Real figure: ~0.2-0.35 s (the VAD's
    # own latency, scripts/bench_aec.py --clean-uplink); the bound leaves room for a slow machine.
    near = utterance("Stop, tell me the time instead.", lead_s=0.0, tail_s=0.0).pcm
    result = simulate_device(reply, sdk_device(0.5).with_clean_uplink(), near=near, near_at_s=at_s)
    found = onsets(result.out)
    assert found and result.near_start_s < found[0] < result.near_start_s + 0.6


def test_jitter_buffer_waits_for_its_start_depth_and_pauses_when_dry():
    # frames arrive in two bursts; the device starts once 3 are queued and runs dry between bursts
    arrived = [0.0, 0.0, 100.0, 100.0, 400.0, 400.0, 400.0]
    starts = play_starts(arrived, start_frames=3, grain_ms=10.0)
    assert starts[:4] == [100.0, 160.0, 220.0, 280.0]  # waited for the third frame
    assert starts[4] == 400.0  # ran dry at 340 and, 3 queued again at 400, resumed
    assert starts[5:] == [460.0, 520.0]


def test_bursty_network_delivers_in_order_at_burst_instants():
    rng = np.random.default_rng(0)
    sends = [k * 60.0 for k in range(20)]
    got = arrivals(sends, base_ms=20.0, jitter_ms=30.0, burst_ms=200.0, rng=rng)
    assert all(b >= a for a, b in zip(got, got[1:], strict=False))
    assert all(g >= s + 20.0 for s, g in zip(sends, got, strict=True))
    bursts = np.diff(sorted(set(got))) / 200.0
    assert np.allclose(bursts, np.round(bursts)) and len(bursts) < 10  # whole bursts, 200 ms apart
