"""One reply's text: streamed LLM deltas -> an ``Emotion`` first, then spoken sentences.

``Reply.events()`` only yields; the turn (gateway/speech/turn.py) sends the emotion to the device.

With tools (a ``ToolSet`` and a model that can call them) the deltas come from the tool loop
(gateway/tools/runner.py); its filler sentences are spoken but are no part of the answer's text.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from gateway.llm.base import ChatLLM, LLMError
from gateway.llm.tool_calls import ToolCallingLLM
from gateway.speech.segmenter import SentenceSegmenter
from gateway.speech.text_cleaning import first_emoji
from gateway.tools.runner import Filler, OnToolCall, ToolLoopSettings, ToolsRunning, answer_with_tools
from gateway.tools.toolset import ToolSet
from gateway.xiaozhi.emotions import DEFAULT_EMOTION, emotion_for_emoji

log = logging.getLogger(__name__)

SAD = ("😔", "sad")  # the face of a reply the LLM failed to give


@dataclass(frozen=True)
class Emotion:
    """The reply's face (one of the firmware's emotion names) and the emoji it came from."""

    emotion: str
    emoji: str


ReplyEvent = Emotion | str  # a str is a sentence to speak


class Reply:
    """One LLM answer as events (at most one ``Emotion``, before any sentence); collects the spoken text."""

    def __init__(
        self,
        *,
        llm: ChatLLM,
        messages: list[dict[str, str]],
        segmenter: SentenceSegmenter,
        apology: str,
        emotion: bool = True,
        on_error: Callable[[], None] | None = None,
        tools: ToolSet | None = None,
        tool_settings: ToolLoopSettings | None = None,
        on_tool_call: OnToolCall | None = None,
    ) -> None:
        self._llm = llm
        self._tools = tools
        self._tool_settings = tool_settings or ToolLoopSettings()
        self._on_tool_call = on_tool_call
        self._messages = messages
        self._segmenter = segmenter
        self._apology = apology
        self._emotion = emotion
        self._on_error = on_error
        self.text_parts: list[str] = []
        self.failed = False

    @staticmethod
    def _emotion_of(delta: str) -> Emotion:
        emoji = first_emoji(delta)
        emotion = emotion_for_emoji(emoji) if emoji else None
        if emoji is None or emotion is None:
            emoji, emotion = DEFAULT_EMOTION
        return Emotion(emotion=emotion, emoji=emoji)

    def _stream(self) -> AsyncGenerator[str | ToolsRunning | Filler, None]:
        if self._tools and isinstance(self._llm, ToolCallingLLM):
            return answer_with_tools(
                self._llm, self._messages, self._tools, self._tool_settings, self._on_tool_call
            )
        return self._llm.stream_chat(self._messages)

    async def events(self) -> AsyncGenerator[ReplyEvent, None]:
        emotion_sent = not self._emotion
        yielded = False  # a sentence of the answer (fillers do not count)
        stream = self._stream()
        try:
            async with contextlib.aclosing(stream):  # closing the reply cancels running tool calls
                async for delta in stream:
                    if isinstance(delta, ToolsRunning | Filler):  # what was said before the tools, now
                        for sentence in self._segmenter.flush():
                            yielded = True
                            yield sentence
                        if isinstance(delta, Filler):
                            yield delta.text
                        continue
                    if not delta:
                        continue
                    if not emotion_sent and delta.strip():
                        emotion_sent = True
                        yield self._emotion_of(delta)
                    self.text_parts.append(delta)
                    for sentence in self._segmenter.push(delta):
                        yielded = True
                        yield sentence
        except LLMError as exc:
            log.warning("LLM failed: %s", exc)
            self.failed = True
            if self._on_error:
                self._on_error()
        for sentence in self._segmenter.flush():
            yielded = True
            yield sentence
        if self.failed and not yielded:
            if not emotion_sent:
                yield Emotion(emotion=SAD[1], emoji=SAD[0])
            yield self._apology

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


async def fixed_sentences(texts: list[str]) -> AsyncGenerator[str, None]:
    for text in texts:
        yield text
