"""One reply's text: streamed LLM deltas -> emotion message + spoken sentences."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.llm.base import ChatLLM, LLMError
from gateway.segmenter import SentenceSegmenter
from gateway.text_cleaning import first_emoji
from gateway.xiaozhi import LlmEmotion
from gateway.xiaozhi.emotions import DEFAULT_EMOTION, emotion_for_emoji

log = logging.getLogger(__name__)


class Reply:
    """Async iterator of sentences for one LLM answer; collects the spoken text."""

    def __init__(
        self,
        *,
        llm: ChatLLM,
        messages: list[dict[str, str]],
        segmenter: SentenceSegmenter,
        send: Callable[[object], Awaitable[None]],
        apology: str,
        send_emotion: bool = True,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._llm = llm
        self._messages = messages
        self._segmenter = segmenter
        self._send = send
        self._apology = apology
        self._send_emotion = send_emotion
        self._on_error = on_error
        self.text_parts: list[str] = []
        self.failed = False

    async def _emit_emotion(self, delta: str) -> None:
        emoji = first_emoji(delta)
        emotion = emotion_for_emoji(emoji) if emoji else None
        if emoji is None or emotion is None:
            emoji, emotion = DEFAULT_EMOTION
        await self._send(LlmEmotion(emotion=emotion, text=emoji))

    async def sentences(self) -> AsyncIterator[str]:
        emotion_sent = not self._send_emotion
        yielded = False
        try:
            async for delta in self._llm.stream_chat(self._messages):
                if not delta:
                    continue
                if not emotion_sent and delta.strip():
                    await self._emit_emotion(delta)
                    emotion_sent = True
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
                await self._send(LlmEmotion(emotion="sad", text="😔"))
            yield self._apology

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


async def fixed_sentences(texts: list[str]) -> AsyncIterator[str]:
    for text in texts:
        yield text
