"""Fakes for turn and session tests: an engine of fixed PCM chunks, a scripted LLM, a slow tool.

`names()` turns the messages a turn sent into a compact trace: consecutive audio frames become one
"audio" entry, so a trace reads like the protocol's turn diagrams (docs/xiaozhi-protocol.md §10).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from gateway.llm.base import LLMError
from gateway.llm.tool_calls import ToolCall
from gateway.speech.turn import TurnConfig
from gateway.tools.base import ToolSpec
from gateway.xiaozhi import AudioOut, LlmEmotion, Stt, TtsSentenceStart, TtsStart, TtsStop
from tts_engine.errors import EngineUnavailable

RATE = 16000
FAST = TurnConfig(sample_rate=RATE, prebuffer_frames=30, start_gap_ms=0, stop_margin_ms=0, apology="抱歉。")

_NAMES = {
    Stt: "stt",
    TtsStart: "tts start",
    TtsStop: "tts stop",
    LlmEmotion: "emotion",
    TtsSentenceStart: "sentence",
    AudioOut: "audio",
}


def names(sent: list[object]) -> list[str]:
    trace: list[str] = []
    for message in sent:
        name = _NAMES.get(type(message), type(message).__name__)
        if name == "audio" and trace and trace[-1] == "audio":
            continue
        trace.append(name)
    return trace


def sentences(sent: list[object]) -> list[str]:
    return [m.text for m in sent if isinstance(m, TtsSentenceStart)]


class FakeStream:
    """One sentence's synthesis: `chunks` chunks of a constant tone; may fail or hang after some."""

    def __init__(self, chunks: int, chunk_samples: int, *, fail: bool = False, hang_after: int | None = None):
        self._left = chunks
        self._chunk = np.full(chunk_samples, 1000, np.int16)
        self._fail = fail
        self._hang_after = hang_after
        self._given = 0
        self.playback_ahead = 0.0
        self.is_aborted = False

    @property
    def unread_seconds(self) -> float:
        return self._left * len(self._chunk) / RATE

    def set_playback_ahead(self, seconds: float) -> None:
        self.playback_ahead = seconds

    async def __aenter__(self) -> FakeStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self.is_aborted = self._left > 0

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> np.ndarray:
        await asyncio.sleep(0)
        if self._fail:
            raise EngineUnavailable("the worker went away")
        if self._hang_after is not None and self._given >= self._hang_after:
            await asyncio.Event().wait()  # until cancelled
        if self._left <= 0:
            raise StopAsyncIteration
        self._left -= 1
        self._given += 1
        return self._chunk


class FakeEngine:
    """`synthesize` gives each sentence two chunks of 120 ms (four 60 ms frames in all)."""

    def __init__(self, *, fail: tuple[str, ...] = (), hang: tuple[str, ...] = ()) -> None:
        self._fail = fail
        self._hang = hang
        self.texts: list[str] = []
        self.voices_used: list[str | None] = []
        self.voices = ["default", "other"]
        self.default_voice = "default"

    def resolve_voice(self, voice: str | None) -> str:
        return voice or self.default_voice

    def synthesize(self, text: str, *, voice: str | None = None, output_rate: int | None = None,
                   playback_ahead: float = 0.0, priority: str = "interactive") -> FakeStream:  # fmt: skip
        self.texts.append(text)
        self.voices_used.append(voice)
        return FakeStream(
            2, RATE * 120 // 1000, fail=text in self._fail, hang_after=1 if text in self._hang else None
        )


class ScriptedLLM:
    """Answers with fixed rounds: each round a list of text deltas and, optionally, tool calls."""

    def __init__(self, *rounds: list[str | list[ToolCall]], fail: bool = False) -> None:
        self._rounds = list(rounds)
        self._fail = fail
        self.requests: list[list[dict[str, Any]]] = []

    async def stream_chat(self, messages: list[dict[str, str]]) -> AsyncIterator[str]:
        async for item in self.stream_round(messages, []):
            if isinstance(item, str):
                yield item

    async def stream_round(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, tool_choice: str = "auto"
    ) -> AsyncIterator[str | list[ToolCall]]:
        self.requests.append(list(messages))
        if self._fail:
            raise LLMError("the model is down")
        for item in self._rounds.pop(0) if self._rounds else []:
            await asyncio.sleep(0)
            yield item


class SlowTool:
    """A tool source with one tool that answers after `delay_s`."""

    name = "device"

    def __init__(self, delay_s: float, result: str = "晴，25度") -> None:
        self._delay_s = delay_s
        self._result = result
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def list_tools(self) -> list[ToolSpec]:
        return [ToolSpec("weather", "today's weather")]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls.append((name, arguments))
        await asyncio.sleep(self._delay_s)
        return self._result
