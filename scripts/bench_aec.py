"""Server-side AEC per device model: false barge-ins, barge-in latency, CPU (offline, simulated time).

    python scripts/bench_aec.py [--device-model NAME|all] [--seeds 0,1,2] [--clean-uplink]
                                [--replies 20] [--double-talk 20] [--aec3-only] [--quick]

For each device model (scripts/aec_devices.py: how the device plays our downlink,
what its uplink carries, the echo path, clock drift, v1 or v2) and seed it plays
espeak-ng replies into the real `EchoCanceller` (default configuration: AEC3 and
the double-talk stage; `--aec3-only`: asr.aec_double_talk off) and runs the
session's `Listener` (Silero VAD, default config) on the cleaned uplink exactly as
a realtime session would:

* echo only: `--replies` replies with no one talking; a reply with a VAD onset is a
  false barge-in.
* barge-in: `--double-talk` replies with a user sentence starting 2-5 s after the
  device started playing; latency from its onset to the end of the 60 ms uplink
  frame in which the VAD confirms speech (network time not included). A trial
  without an onset while the user talks is missed.
* `--clean-uplink`: the same trials with no echo at all (the microphone hears only
  the user and noise): barge-in must be as fast as without AEC.

Trials are drawn from fixed seeds (the reply, the device's numbers, the user's
sentence and onset). Prints the git commit and settings, then one table row per
model and seed; CPU is the canceller's thread time per second of uplink (share
of one core). `--quick`: 3 echo-only replies and 3 barge-ins per model and seed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.aec_devices import MODELS, DeviceModel  # noqa: E402
from scripts.aec_sim import RATE, erle_db, onsets, simulate, simulate_device  # noqa: E402
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
GOAL_S = 0.4


def random_path(rng: np.random.Generator, seed: int) -> EchoPath:
    """The legacy model's echo path (the bench before device models)."""
    return EchoPath(
        delay_ms=float(rng.uniform(40, 250)),
        gain_db=float(rng.uniform(-20, -6)),
        rir=room_impulse_response(length_ms=float(rng.uniform(15, 40)), seed=seed),
    )


def reply_audio(rng: np.random.Generator) -> np.ndarray:
    texts = list(rng.choice(REPLIES, size=3, replace=False))
    voice = str(rng.choice(["en", "en-us", "en-gb"]))
    return utterance(texts, voice=voice, lead_s=0.1, gap_s=0.3, tail_s=0.3).pcm


@dataclass
class Played:
    out: np.ndarray
    mic: np.ndarray
    reply_start_s: float
    near_start_s: float | None
    cpu_s: float
    erle_db: float | None
    delay_error_ms: float | None


def play(
    model: DeviceModel,
    rng: np.random.Generator,
    n: int,
    *,
    clean: bool,
    linear: bool,
    near: np.ndarray | None = None,
    near_at_s: float = 0.0,
) -> Played:
    """One trial drawn from `rng` (the same draws with and without `clean`)."""
    reply = reply_audio(rng)
    if model.legacy:
        path = random_path(rng, n)
        if clean:
            path = EchoPath(delay_ms=0.0, gain_db=-300.0, rir=np.ones(1))
        r = simulate(
            reply, path, timestamps=model.timestamps, near=near, near_at_s=near_at_s, seed=n, linear=linear
        )
        delay = r.canceller.delay_ms
        error = None if delay is None or clean else abs(delay - r.true_delay_ms)
        erle = None if clean else erle_db(r.mic[3 * RATE : reply.size], r.out[3 * RATE : reply.size])
        return Played(r.out, r.mic, 0.0, None if near is None else near_at_s, r.cpu_s, erle, error)
    trial = model.draw(rng)
    if clean:
        trial = trial.with_clean_uplink()
    d = simulate_device(reply, trial, near=near, near_at_s=near_at_s, linear=linear)
    erle = error = None
    if not clean:
        lo = int((d.reply_start_s + 3.0) * RATE)
        hi = int(d.reply_start_s * RATE) + reply.size
        erle = erle_db(d.mic[lo:hi], d.out[lo:hi])
        if d.canceller.delay_ms is not None:
            error = abs(d.canceller.delay_ms - float(np.median(d.true_delays_ms[-20:])))
    return Played(d.out, d.mic, d.reply_start_s, d.near_start_s, d.cpu_s, erle, error)


@dataclass
class Figures:
    replies: int = 0
    false_replies: int = 0  # echo-only replies with a VAD onset
    trials: int = 0
    within: int = 0  # barge-ins within GOAL_S of speech onset
    missed: int = 0
    early: int = 0  # barge-in trials with an onset before the user spoke
    latencies: list[float] = field(default_factory=list)
    erles: list[float] = field(default_factory=list)
    delay_errors: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    audio_s: float = 0.0

    def add(self, played: Played, *, echo_only: bool) -> None:
        self.cpu_s += played.cpu_s
        self.audio_s += played.mic.size / RATE
        if echo_only and played.erle_db is not None:
            self.erles.append(played.erle_db)
        if echo_only and played.delay_error_ms is not None:
            self.delay_errors.append(played.delay_error_ms)


def run(model: DeviceModel, seed: int, replies: int, trials: int, *, clean: bool, linear: bool) -> Figures:
    figures = Figures()
    rng = np.random.default_rng(seed)
    for n in range(replies):
        played = play(model, rng, n, clean=clean, linear=linear)
        figures.add(played, echo_only=True)
        figures.replies += 1
        figures.false_replies += bool(onsets(played.out))
    rng = np.random.default_rng(seed + 1000)
    for n in range(trials):
        near = utterance(str(rng.choice(NEAR)), lead_s=0.0, tail_s=0.0).pcm
        at_s = float(rng.uniform(2.0, 5.0))
        played = play(model, rng, n, clean=clean, linear=linear, near=near, near_at_s=at_s)
        figures.add(played, echo_only=False)
        figures.trials += 1
        start = played.near_start_s or 0.0
        found = onsets(played.out)
        figures.early += any(t < start for t in found)
        after = [t - start for t in found if t >= start]
        if after and after[0] < near.size / RATE:
            figures.latencies.append(after[0])
            figures.within += after[0] <= GOAL_S
        else:
            figures.missed += 1
    return figures


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def cells(f: Figures) -> str:
    worst = f"{1000 * max(f.latencies):6.0f}" if f.latencies else "     -"
    return f"{f.false_replies:3d}/{f.replies:<3d} {f.within:3d}/{f.trials:<3d} {worst} {f.missed:4d} {f.early:4d}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device-model", default="all", help=f"one of {', '.join(MODELS)}, or all")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: --seed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replies", type=int, default=20, help="echo-only replies per model and seed")
    parser.add_argument("--double-talk", type=int, default=20, help="barge-in trials per model and seed")
    parser.add_argument(
        "--clean-uplink", action="store_true", help="also the same trials with no echo at all"
    )
    parser.add_argument("--quick", action="store_true", help="3 replies and 3 barge-ins (a smoke run)")
    parser.add_argument(
        "--aec3-only",
        action="store_true",
        help="without the linear double-talk stage beside AEC3 (asr.aec_double_talk: false)",
    )
    args = parser.parse_args()
    if args.device_model != "all" and args.device_model not in MODELS:
        parser.error(f"unknown device model {args.device_model!r}; known: {', '.join(MODELS)}")
    models = list(MODELS.values()) if args.device_model == "all" else [MODELS[args.device_model]]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    replies, trials = (3, 3) if args.quick else (args.replies, args.double_talk)
    linear = not args.aec3_only
    print(f"commit {git_commit()}; {'AEC3 only' if args.aec3_only else 'AEC3 + double-talk stage'}")
    print(
        f"seeds {seeds}; {replies} echo-only replies and {trials} barge-ins per model and seed; goal {GOAL_S} s"
    )
    for model in models:
        print(f"  {model.name}: {model.about}")
    clean_head = "  clean: false   in400  max_ms miss early" if args.clean_uplink else ""
    print(f"{'model':16s} seed   AEC: false   in400  max_ms miss early{clean_head}  cpu%  erle_min delay_err")
    failed = False
    for model in models:
        for seed in seeds:
            began = time.monotonic()
            aec = run(model, seed, replies, trials, clean=False, linear=linear)
            row = f"{model.name:16s} {seed:4d}   {cells(aec)}"
            goal = aec.false_replies == 0 and aec.within >= trials - trials // 20
            if args.clean_uplink:
                clean = run(model, seed, replies, trials, clean=True, linear=linear)
                row += f"    {cells(clean)}"
                goal = goal and clean.false_replies == 0 and clean.within >= trials - trials // 20
            cpu = 100 * aec.cpu_s / max(aec.audio_s, 1e-9)
            erle = f"{min(aec.erles):8.1f}" if aec.erles else "       -"
            delay = f"{max(aec.delay_errors):9.1f}" if aec.delay_errors else "        -"
            print(
                f"{row}  {cpu:4.1f} {erle} {delay}  {'ok' if goal else 'MISSED'} ({time.monotonic() - began:.0f} s)"
            )
            sys.stdout.flush()
            failed |= not goal
    if not failed:
        print("every model met the goal: no false barge-in, >= 19/20 barge-ins within 400 ms")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
