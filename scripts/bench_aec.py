"""Server-side AEC figures on the synthetic echo path (offline, simulated time).

    python scripts/bench_aec.py [--replies 20] [--double-talk 10] [--aec3-only]

For each alignment (v2 timestamps; delay estimation alone) it plays espeak-ng
replies through random echo paths (delay 40-250 ms, gain -6 to -20 dB, a room
response, light clipping, -65 dBFS noise, an Opus-coded uplink as a device
sends it) into the real `EchoCanceller` (default configuration: AEC3 and the
double-talk stage; `--aec3-only`: asr.aec_double_talk off), then
runs the session's `Listener` (Silero VAD, default config) on the cleaned
uplink exactly as a realtime session would. Reports ERLE after 3 s, the delay
estimate's error, VAD onsets on echo alone (each one a false barge-in), the
barge-in latency from near-end speech onset over a playing reply (the end of
the 60 ms uplink frame in which VAD confirms speech; network time not
included), and the canceller's CPU per session as a share of one core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.aec_sim import RATE, erle_db, onsets, simulate  # noqa: E402
from scripts.echo_path import EchoPath, room_impulse_response  # noqa: E402
from scripts.speech import utterance  # noqa: E402

REPLIES = [
    "This is a long story that keeps going for quite a while.",
    "Once upon a time there was a small robot who liked to sing.",
    "It sang every morning, and the birds sang back to it.",
    "The weather today is sunny with a light breeze from the west.",
    "Tomorrow it will rain in the afternoon, so take an umbrella.",
]
NEAR = ["Stop, tell me the time instead.", "Wait, what about tomorrow?", "Play some music please."]


def random_path(rng: np.random.Generator, seed: int) -> EchoPath:
    return EchoPath(
        delay_ms=float(rng.uniform(40, 250)),
        gain_db=float(rng.uniform(-20, -6)),
        rir=room_impulse_response(length_ms=float(rng.uniform(15, 40)), seed=seed),
    )


def reply_audio(rng: np.random.Generator) -> np.ndarray:
    texts = list(rng.choice(REPLIES, size=3, replace=False))
    voice = str(rng.choice(["en", "en-us", "en-gb"]))
    return utterance(texts, voice=voice, lead_s=0.1, gap_s=0.3, tail_s=0.3).pcm


def echo_only(timestamps: bool, replies: int, seed: int, linear: bool) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    erles, errors, false_barge_ins, cpu, audio_s = [], [], 0, 0.0, 0.0
    for n in range(replies):
        result = simulate(reply_audio(rng), random_path(rng, n), timestamps=timestamps, seed=n, linear=linear)
        converged = slice(3 * RATE, None)
        erles.append(erle_db(result.mic[converged], result.out[converged]))
        if result.canceller.delay_ms is not None:
            errors.append(abs(result.canceller.delay_ms - result.true_delay_ms))
        false_barge_ins += len(onsets(result.out))
        cpu += result.cpu_s
        audio_s += result.mic.size / RATE
    return {
        "erle_db_min": min(erles),
        "erle_db_median": statistics.median(erles),
        "delay_error_ms_max": max(errors) if errors else float("nan"),
        "delay_estimated": len(errors),
        "false_barge_ins": false_barge_ins,
        "cpu_share_of_core": cpu / audio_s,
    }


def double_talk(timestamps: bool, trials: int, seed: int, linear: bool) -> dict[str, float]:
    rng = np.random.default_rng(seed + 1000)
    latencies, missed, early = [], 0, 0
    for n in range(trials):
        near = utterance(str(rng.choice(NEAR)), lead_s=0.0, tail_s=0.0).pcm
        at_s = float(rng.uniform(2.0, 5.0))
        result = simulate(
            reply_audio(rng),
            random_path(rng, n),
            timestamps=timestamps,
            near=near,
            near_at_s=at_s,
            seed=n,
            linear=linear,
        )
        found = onsets(result.out)
        after = [t - at_s for t in found if t >= at_s]
        early += sum(1 for t in found if t < at_s)
        if after and after[0] < near.size / RATE:
            latencies.append(after[0])
        else:
            missed += 1
    return {
        "barge_in_ms_median": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "barge_in_ms_max": 1000 * max(latencies) if latencies else float("nan"),
        "within_400ms": sum(1 for t in latencies if t <= 0.4),
        "trials": trials,
        "missed": missed,
        "false_before_onset": early,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replies", type=int, default=20)
    parser.add_argument("--double-talk", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--aec3-only",
        action="store_true",
        help="without the linear double-talk stage beside AEC3 (asr.aec_double_talk: false)",
    )
    args = parser.parse_args()
    linear = not args.aec3_only
    for timestamps in (True, False):
        name = "v2 timestamps" if timestamps else "delay estimation"
        print(f"== {name}")
        for key, value in echo_only(timestamps, args.replies, args.seed, linear).items():
            print(f"  echo only   {key:22s} {value:.4g}")
        for key, value in double_talk(timestamps, args.double_talk, args.seed, linear).items():
            print(f"  double talk {key:22s} {value:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
