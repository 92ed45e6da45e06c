"""Prometheus metrics of one gateway process (one registry per app)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
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


class KeyLabels:
    """API key names as metric labels, bounded: the first ``max_keys`` names get their own, later ones
    share ``other``; a request whose key is not valid is ``unknown``."""

    OTHER = "other"
    UNKNOWN = "unknown"

    def __init__(self, max_keys: int = 50) -> None:
        self.max_keys = max_keys
        self._named: set[str] = set()

    def __call__(self, name: str | None) -> str:
        if name is None:
            return self.UNKNOWN
        if name in self._named:
            return name
        if len(self._named) < self.max_keys:
            self._named.add(name)
            return name
        return self.OTHER


class _CacheCollector(Collector):
    """The audio cache's counters and sizes at scrape time."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self):
        s = self._stats()
        hits = CounterMetricFamily("xz_cache_hits", "Audio cache hits, by tier", labels=["tier"])
        hits.add_metric(["memory"], s["hits_memory"])
        hits.add_metric(["disk"], s["hits_disk"])
        yield hits
        yield CounterMetricFamily("xz_cache_misses", "Audio cache misses (synthesised)", value=s["misses"])
        size = GaugeMetricFamily("xz_cache_bytes", "Audio kept by the cache, by tier", labels=["tier"])
        size.add_metric(["memory"], s["bytes_memory"])
        size.add_metric(["disk"], s["bytes_disk"])
        yield size
        entries = GaugeMetricFamily("xz_cache_entries", "Audio cache entries, by tier", labels=["tier"])
        entries.add_metric(["memory"], s["entries_memory"])
        entries.add_metric(["disk"], s["entries_disk"])
        yield entries
        evictions = CounterMetricFamily("xz_cache_evictions", "Entries dropped for room, by tier", labels=["tier"])
        evictions.add_metric(["memory"], s["evictions_memory"])
        evictions.add_metric(["disk"], s["evictions_disk"])
        yield evictions
        yield CounterMetricFamily("xz_cache_damaged", "Disk entries found damaged and dropped", value=s["damaged_disk"])


class GatewayMetrics:
    def __init__(self, *, max_key_labels: int = 50) -> None:
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

        # the HTTP/WS API per key (names bounded by KeyLabels), the batch runner
        self.key_label = KeyLabels(max_key_labels)
        self.api_requests = Counter(
            "xz_api_requests", "API requests, by key and outcome (ok, error, rate_limited)", ["key", "outcome"],
            registry=r,
        )
        self.api_characters = Counter("xz_api_characters", "Characters of text spoken, by key", ["key"], registry=r)
        self.api_audio_seconds = Counter("xz_api_audio_seconds", "Audio produced, by key", ["key"], registry=r)
        self.api_first_byte_seconds = Histogram(
            "xz_api_first_byte_seconds", "Speech requests: arrival to the first audio byte, by key", ["key"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.api_rate_limited = Counter(
            "xz_api_rate_limited", "Requests refused by a limit, by key and limit", ["key", "limit"], registry=r
        )
        self.batch_items = Counter(
            "xz_batch_items", "Batch items finished by this gateway, by outcome", ["outcome"], registry=r
        )

    def observe_api(self, key: str | None, *, ok: bool, characters: int = 0, audio_s: float = 0.0,
                    first_byte_s: float | None = None, limited: str | None = None) -> None:  # fmt: skip
        """One API request of key ``key`` (None: a key that is not valid)."""
        label = self.key_label(key)
        self.api_requests.labels(label, "rate_limited" if limited else "ok" if ok else "error").inc()
        if limited:
            self.api_rate_limited.labels(label, limited).inc()
        if characters:
            self.api_characters.labels(label).inc(characters)
        if audio_s:
            self.api_audio_seconds.labels(label).inc(audio_s)
        if first_byte_s is not None:
            self.api_first_byte_seconds.labels(label).observe(first_byte_s)

    def watch_cache(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.registry.register(_CacheCollector(stats))

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
