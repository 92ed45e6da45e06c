"""The figures of scripts/bench_gateway.py: per-turn arrival statistics (first audio, frame intervals,
late frames, underruns as a device would hear them, UDP loss) summed over a run, and the table printed per
run."""

from __future__ import annotations

from dataclasses import dataclass, field

from scripts.bench_transport import arrival_gaps, lost_frames
from scripts.device_sim_turn import Turn

__all__ = ["EARLY_FRAMES", "FRAME_S", "LATE_S", "Stats", "device_underruns", "percentile", "print_table"]

FRAME_S = 0.06
LATE_S = FRAME_S + 0.005  # a frame arriving later than this after the one before it is late
EARLY_FRAMES = 10  # "first frames of a turn" for late10_pct


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


@dataclass
class Stats:
    first_audio: list[float] = field(default_factory=list)
    stt: list[float] = field(default_factory=list)
    intervals: list[float] = field(default_factory=list)
    underruns: int = 0
    turns: int = 0
    failed: int = 0
    early_gaps: int = 0  # inter-arrival gaps among the first EARLY_FRAMES frames of each turn
    early_late: int = 0
    gaps: int = 0  # gaps after the pre-buffer burst, whole turns
    late: int = 0
    frames: int = 0
    lost: int = 0  # downlink packets a UDP device missed (sequence gaps)

    def add_turn(self, turn: Turn) -> None:
        self.turns += 1
        if turn.first_audio_latency is not None:
            self.first_audio.append(turn.first_audio_latency)
        gaps = arrival_gaps(turn)  # a gap that a lost UDP packet explains is loss, not lateness
        steady = gaps[5:]
        self.intervals.extend(steady)
        self.underruns += device_underruns(turn)
        self.frames += len(turn.frames)
        self.lost += lost_frames(turn)
        early = gaps[: EARLY_FRAMES - 1]
        self.early_gaps += len(early)
        self.early_late += sum(g > LATE_S for g in early)
        self.gaps += len(steady)
        self.late += sum(g > LATE_S for g in steady)


def device_underruns(turn: Turn, frame_s: float = FRAME_S) -> int:
    """Times the device's playback queue ran dry before the turn's last frame."""
    play_end = None
    count = 0
    for record in turn.frames:
        if play_end is not None and record.t > play_end + 0.005:
            count += 1
        play_end = (record.t if play_end is None or record.t > play_end else play_end) + frame_s
    return count


def print_table(
    backend: str,
    rows: list[dict[str, float]],
    *,
    speech: bool = False,
    burst: bool = False,
    engine: str | None = None,
    transport: str | None = None,
) -> None:
    cols = [
        ("devices", "{:>7.0f}"),
        ("turns", "{:>6.0f}"),
        ("failed", "{:>6.0f}"),
        *([("stt_p50_ms", "{:>10.1f}"), ("stt_p95_ms", "{:>10.1f}")] if speech else []),
        ("first_p50_ms", "{:>12.1f}"),
        ("first_p95_ms", "{:>12.1f}"),
        ("interval_mean_ms", "{:>16.2f}"),
        ("gap_p99_ms", "{:>10.1f}"),
        ("underruns", "{:>9.0f}"),
        ("late10_pct", "{:>10.1f}"),
        ("late_pct", "{:>8.1f}"),
        ("cpu_pct_per_device", "{:>18.2f}"),
        *([("worker_cpu_pct_per_device", "{:>25.2f}"), ("steps_per_s", "{:>11.1f}")] if engine else []),
        *([("client_cpu_pct", "{:>14.1f}")] if transport else []),
        *([("udp_lost_pct", "{:>12.2f}")] if transport and transport != "websocket" else []),
    ]
    notes = [" (speech: latencies from the end of the user's speech)" if speech else ""]
    notes.append(" (burst: every turn starts on all devices at once)" if burst else "")
    engine_note = f", engine: {engine}" if engine else ""
    engine_note += f", transport: {transport}" if transport else ""
    print(f"\nbackend: {backend}{engine_note}" + "".join(notes))
    print(" ".join(f"{name:>{len(fmt.format(0))}}" for name, fmt in cols))
    for row in rows:
        print(" ".join(fmt.format(row[name]) for name, fmt in cols))
