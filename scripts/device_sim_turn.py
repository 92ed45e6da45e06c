"""What a simulated device (scripts/device_sim.py) received: each downlink message and frame with its
arrival time (`Record`), the downlink packets a lossy link lost (`LostFrames`), and one reply turn with its
figures (`Turn`: first-audio latency, frame gaps, bursts)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.xiaozhi import AudioOut, LlmEmotion, Stt, TtsSentenceStart

__all__ = ["LostFrames", "Record", "Turn"]


@dataclass(frozen=True)
class LostFrames:
    """Downlink packets missing before the next one (UDP): the decoder conceals them."""

    packets: int


@dataclass
class Record:
    t: float  # monotonic arrival time
    event: Any


@dataclass
class Turn:
    """Everything the device received between the query and `tts stop`."""

    t_query: float
    records: list[Record] = field(default_factory=list)
    sample_rate: int = 16000
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))

    @property
    def events(self) -> list[Any]:
        return [r.event for r in self.records]

    @property
    def frames(self) -> list[Record]:
        return [r for r in self.records if isinstance(r.event, AudioOut)]

    @property
    def stt(self) -> str | None:
        return next((e.text for e in self.events if isinstance(e, Stt)), None)

    @property
    def sentences(self) -> list[str]:
        return [e.text for e in self.events if isinstance(e, TtsSentenceStart)]

    @property
    def emotions(self) -> list[str]:
        return [e.emotion for e in self.events if isinstance(e, LlmEmotion)]

    def time_of(self, kind: type) -> float | None:
        return next((r.t for r in self.records if isinstance(r.event, kind)), None)

    @property
    def first_audio_latency(self) -> float | None:
        frames = self.frames
        return frames[0].t - self.t_query if frames else None

    @property
    def gaps(self) -> list[float]:
        times = [r.t for r in self.frames]
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    def steady_intervals(self, skip: int = 5) -> list[float]:
        """Frame intervals after the pre-buffer burst."""
        return self.gaps[skip:]

    @property
    def max_burst(self) -> int:
        """Longest run of frames arriving less than 20 ms apart."""
        best = run = 1 if self.frames else 0
        for gap in self.gaps:
            run = run + 1 if gap < 0.02 else 1
            best = max(best, run)
        return best

    def summary(self) -> dict[str, Any]:
        gaps = self.steady_intervals()
        return {
            "stt": self.stt,
            "sentences": len(self.sentences),
            "frames": len(self.frames),
            "audio_s": round(self.audio.size / self.sample_rate, 3),
            "first_audio_ms": None
            if self.first_audio_latency is None
            else round(self.first_audio_latency * 1000, 1),
            "mean_interval_ms": round(statistics.mean(gaps) * 1000, 2) if gaps else None,
            "max_gap_ms": round(max(gaps) * 1000, 1) if gaps else None,
            "max_burst": self.max_burst,
        }
