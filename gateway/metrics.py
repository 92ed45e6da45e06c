"""Prometheus metrics of one gateway process (one registry per app)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gateway.aec import EchoStats

LATENCY_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
ERLE_BUCKETS = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 50.0)
AEC_DELAY_BUCKETS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.2)
TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
RECENT_FIRST_AUDIO = 512  # the last turns' first-audio latencies kept for the console's chart (GET /v1/status)


class _EngineCollector(Collector):
    """Exports the engine's own counters at scrape time."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self):
        for key, value in sorted(self._stats().items()):
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            yield GaugeMetricFamily(f"xz_engine_{key}", f"TTS engine statistic {key}", value=value)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge("xz_sessions_active", "Device sessions open now", registry=r)
        self.sessions_total = Counter("xz_sessions", "Device sessions opened", registry=r)
        self.turns_total = Counter("xz_turns", "Turns started, by kind", ["kind"], registry=r)
        self.turns_aborted = Counter("xz_turns_aborted", "Turns cut short by abort or a new turn", registry=r)
        self.first_audio_seconds = Histogram(
            "xz_first_audio_seconds",
            "Time from the user's query to the first audio frame sent",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # (wall-clock time, seconds) of the latest turns: the histogram cannot say *when*
        self.recent_first_audio: deque[tuple[float, float]] = deque(maxlen=RECENT_FIRST_AUDIO)
        self.frames_sent = Counter("xz_frames_sent", "Downlink Opus frames sent", registry=r)
        self.frames_received = Counter("xz_frames_received", "Uplink Opus frames received", registry=r)
        self.underruns = Counter("xz_underruns", "Times a device ran out of audio mid-turn", registry=r)
        self.protocol_errors = Counter(
            "xz_protocol_errors", "Device messages dropped as malformed", ["kind"], registry=r
        )
        self.llm_errors = Counter("xz_llm_errors", "LLM calls that failed", registry=r)
        self.tts_errors = Counter("xz_tts_errors", "Sentences whose synthesis failed", registry=r)
        self.ota_requests = Counter("xz_ota_requests", "OTA requests served", registry=r)
        self.utterance_overflow = Counter(
            "xz_utterance_overflow", "Uplink audio dropped at the utterance length bound", registry=r
        )
        # tool calls of the LLM: sources are configured (builtin, device, mcp:NAME), so the labels are bounded
        self.tool_calls = Counter(
            "xz_tool_calls",
            "Tool calls the LLM made, by source and outcome",
            ["source", "outcome"],
            registry=r,
        )
        self.tool_call_seconds = Histogram(
            "xz_tool_call_seconds",
            "Time a tool call took, by source",
            ["source"],
            buckets=TOOL_BUCKETS,
            registry=r,
        )
        # server-side echo cancellation, one observation per session that ran it (no per-session labels)
        self.aec_sessions = Counter(
            "xz_aec_sessions", "Sessions with server-side AEC, by how they aligned", ["alignment"], registry=r
        )
        self.aec_erle_db = Histogram(
            "xz_aec_erle_db",
            "Echo return loss enhancement of a session while our reply played (dB)",
            buckets=ERLE_BUCKETS,
            registry=r,
        )
        self.aec_delay_seconds = Histogram(
            "xz_aec_delay_seconds",
            "Estimated echo delay of a session, from our play-time model to the uplink",
            buckets=AEC_DELAY_BUCKETS,
            registry=r,
        )

    def observe_tool_call(self, source: str, outcome: str, seconds: float) -> None:
        """One tool call the LLM made: its source (``builtin``, ``device``, ``mcp:NAME``), outcome, time."""
        self.tool_calls.labels(source, outcome).inc()
        self.tool_call_seconds.labels(source).observe(seconds)

    def observe_first_audio(self, seconds: float) -> None:
        """One turn's time from the query to its first audio frame: the histogram and the recent list."""
        self.first_audio_seconds.observe(seconds)
        self.recent_first_audio.append((time.time(), seconds))

    def observe_aec(self, stats: EchoStats) -> None:
        """One session's server-side echo cancellation, recorded when the session ends."""
        self.aec_sessions.labels("timestamps" if stats.aligned_by_timestamps else "estimated").inc()
        if stats.erle_db is not None:
            self.aec_erle_db.observe(stats.erle_db)
        if stats.delay_ms is not None:
            self.aec_delay_seconds.observe(stats.delay_ms / 1000)

    def watch_engine(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.registry.register(_EngineCollector(stats))
