"""Realistic traffic for the engine benchmarks: replies of Chinese and English sentences arriving as a
Poisson process, each played the way the gateway's speaker plays a reply.

Used by ``scripts/bench_engine.py --arrivals poisson`` (the engine alone) and by
``scripts/bench_gateway.py --arrivals poisson`` (the replies as device turns). Standard library only here
(the engine side needs no web stack, the GPU report runs it on a bare CUDA image).

- Replies (``make_replies``): a fixed-seed draw of a language (half Chinese, half English) and 1-6
  sentences (weights ``SENTENCES_PER_REPLY``) from the corpora below, which run from a few words to a
  long sentence. ``speech_seconds`` says how long a sentence takes to say (4.5 CJK characters or 2.6
  English words a second); the engine benchmark makes the random-weight LLM emit that many speech
  tokens (25 a second) for it.
- Arrivals (``poisson_arrivals``): exponential gaps at a rate in replies per second, fixed seed.
- Playing (``play_reply``): what gateway/speech/speaker.py does with one sentence of look-ahead:
  sentence k + 1 is requested as sentence k starts to play (its first chunk arrives), with the audio
  still to play before it as its ``playback_ahead``, refreshed after every chunk for every open sentence
  (the one playing gets what the listener still has buffered), device priority; a chunk is taken once
  the listener holds no more than ``lead_s`` of audio (the gateway's pre-buffer, 5 frames of 60 ms).
  ``paced=False`` takes chunks as fast as they come (a capacity run). (The gateway asks for a sentence
  as soon as the LLM has written it and the one-slot queue to its player has room, which can be
  before the one ahead has audio; with the LLM's text arriving over time that is mostly the same.)
- Per sentence (``SentenceRecord``): when it was requested, its first chunk, mid-stream underruns (the
  listener ran dry between two chunks of a started sentence) and the gap before it started when the
  previous sentence had already finished playing.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TOKENS_PER_SECOND = 25
RATE_SEED_OFFSET = 1000  # a load's arrivals draw from its seed + this (bench_engine_poisson.py)
GATEWAY_LEAD_S = 0.3  # audio.prebuffer_frames (5) x 60 ms frames: what the device holds before the next chunk
SENTENCES_PER_REPLY = {1: 30, 2: 25, 3: 18, 4: 12, 5: 9, 6: 6}  # weights
CJK_PER_SECOND = 4.5
WORDS_PER_SECOND = 2.6

ZH_SENTENCES = (
    "好的。",
    "没问题，马上为你查一下。",
    "今天北京晴，最高气温二十六度。",
    "明天可能会下小雨，出门记得带伞。",
    "我已经帮你把闹钟设在明天早上七点。",
    "这首歌是周杰伦在二零零三年发行的。",
    "你说得对，早点休息对身体更好。",
    "从这里到火车站大约需要二十分钟，建议你提前出发。",
    "番茄炒蛋先炒鸡蛋，盛出来以后再炒番茄，最后把鸡蛋倒回去一起翻炒。",
    "如果你感觉累了，可以先听一会儿轻音乐，放松一下心情。",
    "我们可以一起去公园散步，顺便看看湖边新开的花。",
    "长城是中国古代的伟大工程，全长超过两万公里，每年吸引大量游客。",
    "嗯，我明白了。",
    "这个问题有点复杂，我分三点来说。",
    "第一，先确认设备已经连上家里的无线网络。",
    "第二，打开应用，在设置里找到设备管理，然后点击添加新设备。",
    "第三，按照屏幕上的提示操作，整个过程大概需要两分钟。",
    "祝你今天心情愉快！",
)
EN_SENTENCES = (
    "Sure.",
    "Okay, let me check that for you.",
    "It is sunny in Beijing today, with a high of twenty six degrees.",
    "Tomorrow there may be light rain, so take an umbrella.",
    "I have set your alarm for seven tomorrow morning.",
    "That song came out in two thousand and three.",
    "You are right, going to bed early is good for you.",
    "The station is about twenty minutes from here, so you may want to leave a little early.",
    "First scramble the eggs, set them aside, then cook the tomatoes and fold the eggs back in.",
    "If you feel tired, some quiet music might help you relax for a while.",
    "We could take a walk in the park and see the new flowers by the lake.",
    "The Great Wall is more than twenty thousand kilometres long and draws millions of visitors every year.",
    "Got it.",
    "That is a slightly longer story, so let me take it in three parts.",
    "First, make sure the speaker is connected to your home network.",
    "Second, open the app, go to device settings and tap add a new device.",
    "Third, follow the steps on the screen; the whole thing takes about two minutes.",
    "Have a nice day!",
)

_CJK = re.compile(r"[\u3400-\u9fff]")
_WORD = re.compile(r"[A-Za-z0-9']+")


def speech_seconds(text: str) -> float:
    """How long ``text`` takes to say: CJK characters at 4.5 a second, words at 2.6 a second, 0.4 s at least."""
    seconds = len(_CJK.findall(text)) / CJK_PER_SECOND + len(_WORD.findall(text)) / WORDS_PER_SECOND
    return max(0.4, seconds)


def tokens_for(text: str) -> int:
    """The speech tokens (25 a second) of ``text`` said at that pace: the benchmarks' LLM length."""
    return max(10, round(TOKENS_PER_SECOND * speech_seconds(text)))


@dataclass(frozen=True)
class Reply:
    language: str
    sentences: tuple[str, ...]

    @property
    def audio_s(self) -> float:
        return sum(tokens_for(s) for s in self.sentences) / TOKENS_PER_SECOND


def make_replies(count: int, seed: int) -> list[Reply]:
    """``count`` replies, the same for the same seed (language, sentence count, sentences)."""
    rng = random.Random(seed)
    sizes, weights = list(SENTENCES_PER_REPLY), list(SENTENCES_PER_REPLY.values())
    replies = []
    for _ in range(count):
        language = rng.choice(("zh", "en"))
        corpus = ZH_SENTENCES if language == "zh" else EN_SENTENCES
        size = rng.choices(sizes, weights)[0]
        replies.append(Reply(language, tuple(rng.choice(corpus) for _ in range(size))))
    return replies


def mean_reply_audio_s() -> float:
    """The expected audio of one reply under the draw above (exact, from the corpora and the weights)."""
    per_sentence = statistics.fmean(
        [tokens_for(s) / TOKENS_PER_SECOND for s in ZH_SENTENCES]
        + [tokens_for(s) / TOKENS_PER_SECOND for s in EN_SENTENCES]
    )
    sizes = SENTENCES_PER_REPLY
    return per_sentence * sum(n * w for n, w in sizes.items()) / sum(sizes.values())


def poisson_arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets (seconds from the start) of ``count`` events of a Poisson process at ``rate``/s."""
    if rate <= 0:
        raise ValueError(f"arrival rate must be positive, got {rate}")
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(count):
        t += rng.expovariate(rate)
        offsets.append(t)
    return offsets


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (nan for no values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


@dataclass
class SentenceRecord:
    reply: int
    index: int  # its place in the reply
    requested_at: float  # time.monotonic()
    first_at: float | None = None  # its first chunk started playing (time.perf_counter())
    ended_at: float | None = None
    audio_s: float = 0.0
    underruns: int = 0  # the listener ran dry between two of its chunks
    dry_s: float = 0.0  # ... for this long in all
    late_start_s: float = 0.0  # it started after the previous sentence had finished playing, by this much
    error: str | None = None  # the engine failed it

    arrived_at: float | None = None  # its first chunk reached the stream (played or not yet)

    @property
    def first_chunk_s(self) -> float | None:
        """Request to the arrival of its first chunk (``time.monotonic()`` both)."""
        return None if self.arrived_at is None else self.arrived_at - self.requested_at


async def play_reply(
    engine: Any,
    reply: Reply,
    number: int,
    *,
    voice: str,
    rate: int,
    lead_s: float = GATEWAY_LEAD_S,
    paced: bool = True,
    priority: str = "device",
) -> list[SentenceRecord]:
    """Synthesise and play one reply as the gateway's speaker does (module docstring); its sentences."""
    records: list[SentenceRecord] = []
    queued: list[Any] = []  # open sentence streams in playing order (the one playing first)
    play_end: float | None = None  # when the audio received so far has finished playing (perf_counter)

    def ahead_of(index: int, now: float) -> float:
        on_device = 0.0 if play_end is None else max(0.0, play_end - now)
        return on_device + sum(stream.unread_seconds for stream in queued[:index])

    def refresh(now: float) -> None:
        for index, stream in enumerate(queued):
            stream.set_playback_ahead(ahead_of(index, now))

    def request(index: int) -> None:
        ahead = ahead_of(len(queued), time.perf_counter())
        queued.append(
            engine.synthesize(
                reply.sentences[index], voice=voice, output_rate=rate, playback_ahead=ahead, priority=priority
            )
        )
        records.append(SentenceRecord(number, index, time.monotonic()))

    async def play_sentence(stream: Any, record: SentenceRecord) -> None:
        nonlocal play_end
        async for chunk in stream:
            now = time.perf_counter()
            if record.first_at is None:
                record.first_at = now
                if play_end is not None and now > play_end and record.index > 0:
                    record.late_start_s = now - play_end
            elif play_end is not None and now > play_end:
                record.underruns += 1
                record.dry_s += now - play_end
            play_end = (now if play_end is None or now > play_end else play_end) + chunk.size / rate
            record.audio_s += chunk.size / rate
            if len(records) == record.index + 1 and record.index + 1 < len(reply.sentences):
                request(record.index + 1)  # the next sentence, requested as this one starts to play
            refresh(now)
            if paced and (wait := play_end - lead_s - time.perf_counter()) > 0:
                await asyncio.sleep(wait)  # the pacer sends the chunk's frames at playback speed

    request(0)
    for index in range(len(reply.sentences)):
        if index >= len(records):
            break  # the sentence before failed before its first chunk: the reply ends there
        stream, record = queued[0], records[index]
        try:
            await play_sentence(stream, record)
        except Exception as exc:  # noqa: BLE001 - counted in the table, the run goes on
            record.error = repr(exc)
        record.arrived_at = getattr(stream, "first_chunk_at", None)
        record.ended_at = time.perf_counter()
        queued.remove(stream)
        refresh(record.ended_at)
    return records


@dataclass
class LoadResult:
    """One run's sentences and the engine's counters over it."""

    load: float
    records: list[SentenceRecord]
    wall_s: float
    stats_delta: dict[str, float] = field(default_factory=dict)

    def row(self, lone_first_s: float) -> dict[str, float]:
        firsts = [r.first_chunk_s for r in self.records if r.first_chunk_s is not None]
        reply_firsts = [r.first_chunk_s for r in self.records if r.index == 0 and r.first_chunk_s is not None]
        busy = self.stats_delta.get("busy_seconds_total", 0.0)
        closing = self.stats_delta.get("wave_closing_seconds_total", float("nan"))
        late = [r.late_start_s for r in self.records if r.late_start_s > 0]
        return {
            "load": self.load,
            "sentences": len(self.records),
            "first_p50_ms": 1000 * percentile(firsts, 50),
            "first_p95_ms": 1000 * percentile(firsts, 95),
            "first_p99_ms": 1000 * percentile(firsts, 99),
            "p95_x_lone": percentile(firsts, 95) / lone_first_s,
            "lone_ms": 1000 * lone_first_s,
            "reply_p95_ms": 1000 * percentile(reply_firsts, 95),
            "underruns": sum(r.underruns for r in self.records),
            "dry_sentences": sum(r.underruns > 0 for r in self.records),
            "late_starts": len(late),
            "late_p95_ms": 1000 * percentile(late, 95) if late else 0.0,
            "failed": sum(r.error is not None for r in self.records),
            "audio_per_s": sum(r.audio_s for r in self.records) / self.wall_s,
            "busy_pct": 100 * busy / self.wall_s,
            "closing_pct": 100 * closing / busy if busy else float("nan"),
        }


COLUMNS = (
    ("load", "{:>5.2f}"), ("sentences", "{:>9.0f}"), ("first_p50_ms", "{:>12.0f}"), ("first_p95_ms", "{:>12.0f}"),
    ("first_p99_ms", "{:>12.0f}"), ("p95_x_lone", "{:>10.2f}"), ("lone_ms", "{:>7.0f}"), ("reply_p95_ms", "{:>12.0f}"),
    ("underruns", "{:>9.0f}"), ("dry_sentences", "{:>13.0f}"), ("late_starts", "{:>11.0f}"),
    ("late_p95_ms", "{:>11.0f}"), ("failed", "{:>6.0f}"), ("audio_per_s", "{:>11.2f}"), ("busy_pct", "{:>8.1f}"), ("closing_pct", "{:>11.1f}"),
)  # fmt: skip


def table_header() -> str:
    return " ".join(f"{name:>{len(fmt.format(0))}}" for name, fmt in COLUMNS)


def table_row(row: dict[str, float]) -> str:
    return " ".join(fmt.format(row[name]) for name, fmt in COLUMNS)
