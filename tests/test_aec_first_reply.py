"""The echo canceller early in the first reply, and a reverberant room's tail (issue 23, item 10).

Bench draws that failed before the fixes (scripts/bench_aec.py; per-trial traces:
scripts/aec_trace.py):

* legacy-v2 seed 1, barge-ins 1 and 3: the user talks 2.3-2.5 s into the first
  reply over a room path. The linear stage's filter already took 15-20 dB off
  the words, but the quiet chunks at their ends (where the Opus codec's noise,
  not the filter, sets what is left) kept its convergence test under half: no
  double talk, the barge-in found 0.66 s late. And where the room's response
  spread the echo, the delay estimate's waveform match at the direct sound's
  lag stayed under its bar (0.08-0.19) while the peak stood 18-20 times over
  the correlation's spread: no linear stage until 2.2 s.
* stall-room-v2 seed 0, barge-in 10: a stage rebuilt after a stall whose loud
  chunks showed 16 of 30 under -10 dB when the user began: half of 30 took it
  for converged (the user's first syllables diluting evidence from the echo
  alone), and the barge-in was found 0.64 s late. The loud chunks alone need
  2/3 of 30.
* reverb-v1 seed 1, reply 16: RT60 0.4 s, the tail 1 dB under the direct
  sound; AEC3 took only 15-25 dB off the tail at the ends of words, and the
  VAD took the ~-45 dBFS left for speech (a false barge-in at 5.2 s).
"""

from __future__ import annotations

import numpy as np
import pytest

from scripts.aec_devices import MODELS, Trial
from scripts.aec_sim import onsets, simulate, simulate_device
from scripts.echo_path import EchoPath, room_impulse_response
from scripts.speech import utterance

STORY = "This is a long story that keeps going for quite a while."
ROBOT = "Once upon a time there was a small robot who liked to sing."
WEATHER = "The weather today is sunny with a light breeze from the west."
BIRDS = "It sang every morning, and the birds sang back to it."
RAIN = "Tomorrow it will rain in the afternoon, so take an umbrella."
STOP = "Stop, tell me the time instead."


def reply(texts: list[str], voice: str) -> np.ndarray:
    return utterance(texts, voice=voice, lead_s=0.1, gap_s=0.3, tail_s=0.3).pcm


@pytest.mark.parametrize(
    ("texts", "voice", "delay_ms", "gain_db", "rir_ms", "n", "at_s"),
    [
        # the filter fits the words (-15..-20 dB) but not yet the quiet chunks at their ends
        (
            [STORY, ROBOT, WEATHER],
            "en",
            54.89981189339782,
            -14.810899029119899,
            39.44467097381467,
            3,
            2.3255724635263566,
        ),
        # the room spreads the echo: the estimate's match at one lag stays under its bar
        (
            [RAIN, WEATHER, STORY],
            "en-gb",
            200.68217434799732,
            -16.451449193632335,
            27.26552459473747,
            1,
            2.456613213530899,
        ),
    ],
    ids=["converged-on-the-words", "delay-through-a-room"],
)
def test_a_barge_in_early_in_the_first_reply_is_found_in_time(
    texts, voice, delay_ms, gain_db, rir_ms, n, at_s
):
    path = EchoPath(delay_ms=delay_ms, gain_db=gain_db, rir=room_impulse_response(length_ms=rir_ms, seed=n))
    near = utterance(STOP, lead_s=0.0, tail_s=0.0).pcm
    r = simulate(reply(texts, voice), path, timestamps=True, near=near, near_at_s=at_s, seed=n)
    found = onsets(r.out)
    assert not [t for t in found if t < at_s], found
    after = [t - at_s for t in found if t >= at_s]
    assert after and after[0] <= 0.4, found


def test_a_barge_in_over_a_stage_rebuilt_after_a_stall_is_found_in_time():
    trial = Trial(
        MODELS["stall-room-v2"], gain_db=-6.791393221459735, start_frames=3, lead_frames=5,
        down_ms=9.537543932288415, burst_ms=77.78049004904157, up_ms=27.888906409417988,
        stall_ms=328.21358043195755, stall_at_s=2.633721378769907, lead_in_ms=861.3053460358775,
        path_delay_ms=193.9342319291446, rir_ms=15.255543036067202, rt60_ms=367.09438971526697,
        drr_db=2.7555198093363478, path_seed=491488185, seed=125242280,
    )  # fmt: skip
    near = utterance(STOP, lead_s=0.0, tail_s=0.0).pcm
    d = simulate_device(
        reply([ROBOT, WEATHER, BIRDS], "en-us"), trial, near=near, near_at_s=4.761983556560354
    )
    start = d.near_start_s or 0.0
    found = onsets(d.out)
    assert not [t for t in found if t < start], found
    after = [t - start for t in found if t >= start]
    assert after and after[0] <= 0.4, (start, found)


def test_a_reverberant_tail_that_aec3_leaves_is_not_speech():
    trial = Trial(
        MODELS["reverb-v1"], gain_db=-2.3095693676377422, start_frames=1, lead_frames=4, down_ms=5.536596906929784,
        burst_ms=134.63702900542475, up_ms=25.655583669279128, drift_ppm=-876.3061292528545, lead_in_ms=411.590391194674, path_delay_ms=58.15908583698675,
        rir_ms=363.0048127192538, rt60_ms=401.3562608337765, drr_db=1.3217884161919569, path_seed=146544963, seed=415248791,
    )  # fmt: skip
    d = simulate_device(reply([WEATHER, ROBOT, STORY], "en"), trial)
    assert onsets(d.out) == []
