"""Per-trial traces of the bench's AEC trials: what the guard and the VAD saw (a diagnosis aid).

    python scripts/aec_trace.py --device-model NAME --seed S [--barge-in 3,7] [--echo-only 5]
                                [--all] [--around 0.6]

Draws exactly the trials scripts/bench_aec.py draws for the model and seed (the
same generator, the trials not asked for are drawn but not simulated) and, for
each trial asked for, prints its outcome (VAD onsets against the user's onset)
and, per 10 ms chunk around the user's onset (or a false onset), what the
canceller's guard saw: microphone and output level (dBFS), the linear stage's
residual against its echo estimate (dB), Geigel's gain against its bound, and
the flags (G guarding, T talk, E may be echo, C converged, L Geigel learnt,
D doubted, P on probation). `--all`: every trial, a line each, traces for the
failed ones only.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.aec.guard import EchoGuard  # noqa: E402
from scripts.aec_devices import MODELS, DeviceModel  # noqa: E402
from scripts.aec_sim import RATE, onsets  # noqa: E402
from scripts.bench_aec import GOAL_S, NEAR, REPLIES, play, random_path  # noqa: E402
from scripts.speech import utterance  # noqa: E402


@dataclass
class Chunk:
    mic_db: float
    out_db: float
    left_db: float | None  # the linear stage's output against its echo estimate
    gain: float | None  # Geigel: microphone peak / reference's recent peak
    bound: float | None  # ... the echo path's usual peak gain
    flags: str
    below: str = ""  # the stage's convergence evidence: chunks left under -10 dB / chunks judged


class Recorder:
    """Wraps EchoGuard.choose: one Chunk per 10 ms chunk of uplink, in stream order."""

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self._original = EchoGuard.choose

    def __enter__(self) -> Recorder:
        original, chunks = self._original, self.chunks

        def choose(guard, pcm, capture_ms, out, ran, stage, played_s):
            n = pcm.size // 160
            mic = pcm[: n * 160].astype(np.float64).reshape(n, 160)
            result = original(guard, pcm, capture_ms, out.copy(), ran, stage, played_s)
            res = result[: n * 160].astype(np.float64).reshape(n, 160)
            for k in range(n):
                flags = "G" if guard.guarding else "."
                left = gain = bound = None
                below = ""
                if ran is not None and stage is not None:
                    lin = ran[0][k * 160 : (k + 1) * 160].astype(np.float64)
                    echo = mic[k] - lin
                    left = 10 * np.log10((np.mean(lin**2) + 1) / (np.mean(echo**2) + 1))
                    flags += "T" if ran[1][k] else "."
                    if stage._last_gain.size == n:
                        gain = float(stage._last_gain[k])
                        bound = stage.peak_gain()
                        flags += "E" if stage.echo_like()[k] else "."
                    flags += "C" if stage.converged else "."
                    flags += "L" if stage.learnt else "."
                    flags += "D" if stage.doubted else "."
                    flags += "P" if stage._fresh is not None else "."
                    below = (
                        f"{sum(stage._below)}/{len(stage._below)} loud {sum(stage._loud_below)}/"
                        f"{len(stage._loud_below)} #{id(stage) % 997}"
                    )
                chunks.append(
                    Chunk(
                        10 * np.log10(np.mean(mic[k] ** 2) / 32768**2 + 1e-12),
                        10 * np.log10(np.mean(res[k] ** 2) / 32768**2 + 1e-12),
                        left,
                        gain,
                        bound,
                        flags,
                        below,
                    )
                )
            return result

        EchoGuard.choose = choose  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        EchoGuard.choose = self._original  # type: ignore[method-assign]


def skip(model: DeviceModel, rng: np.random.Generator, n: int) -> None:
    """The draws `bench_aec.play` makes for a trial, without simulating it."""
    rng.choice(REPLIES, size=3, replace=False)
    rng.choice(["en", "en-us", "en-gb"])
    if model.legacy:
        random_path(rng, n)
    else:
        model.draw(rng)


def show(chunks: list[Chunk], at_s: float, around_s: float) -> None:
    lo = max(int((at_s - around_s) * 100), 0)
    hi = min(int((at_s + around_s) * 100), len(chunks))
    print("      t_s   mic   out  left   gain  bound flags")
    for i in range(lo, hi):
        c = chunks[i]
        left = f"{c.left_db:5.1f}" if c.left_db is not None else "    -"
        gain = f"{c.gain:6.3f}" if c.gain is not None else "     -"
        bound = f"{c.bound:6.3f}" if c.bound is not None else "     -"
        print(
            f"   {i / 100:6.2f} {c.mic_db:5.0f} {c.out_db:5.0f} {left} {gain} {bound} {c.flags:7s} {c.below}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device-model", required=True, choices=list(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--barge-in", default="", help="comma-separated barge-in trial numbers")
    parser.add_argument("--echo-only", default="", help="comma-separated echo-only reply numbers")
    parser.add_argument("--all", action="store_true", help="every trial; traces for the failed ones")
    parser.add_argument("--replies", type=int, default=20)
    parser.add_argument("--double-talk", type=int, default=20)
    parser.add_argument("--around", type=float, default=0.6, help="s of trace either side")
    args = parser.parse_args()
    model = MODELS[args.device_model]
    wanted_echo = set(range(args.replies)) if args.all else {int(s) for s in args.echo_only.split(",") if s}
    wanted_barge = (
        set(range(args.double_talk)) if args.all else {int(s) for s in args.barge_in.split(",") if s}
    )
    rng = np.random.default_rng(args.seed)
    for n in range(args.replies if wanted_echo else 0):
        if n not in wanted_echo:
            skip(model, rng, n)
            continue
        with Recorder() as rec:
            played = play(model, rng, n, clean=False, linear=True)
        found = onsets(played.out)
        print(f"echo-only {n}: reply at {played.reply_start_s:.2f} s, onsets {[round(t, 2) for t in found]}")
        for t in found if (found or not args.all) else []:
            show(rec.chunks, t - 0.3, args.around)
    rng = np.random.default_rng(args.seed + 1000)
    for n in range(args.double_talk if wanted_barge else 0):
        near = utterance(str(rng.choice(NEAR)), lead_s=0.0, tail_s=0.0).pcm
        at_s = float(rng.uniform(2.0, 5.0))
        if n not in wanted_barge:
            skip(model, rng, n)
            continue
        with Recorder() as rec:
            played = play(model, rng, n, clean=False, linear=True, near=near, near_at_s=at_s)
        start = played.near_start_s or 0.0
        found = onsets(played.out)
        after = [t - start for t in found if t >= start]
        latency = after[0] if after and after[0] < near.size / RATE else None
        ok = latency is not None and latency <= GOAL_S and not any(t < start for t in found)
        print(
            f"barge-in {n}: reply at {played.reply_start_s:.2f} s, user at {start:.2f} s "
            f"({start - played.reply_start_s:.2f} s in), onsets {[round(t, 2) for t in found]}, "
            f"latency {'missed' if latency is None else f'{1000 * latency:.0f} ms'} {'ok' if ok else 'FAILED'}"
        )
        if not ok or not args.all:
            show(rec.chunks, start, args.around)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
