"""A chat model that repeats the user, so a fresh install answers without a model or an API key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import regex

from gateway.llm.base import validate_messages

__all__ = ["EchoLLM"]

_HAN = regex.compile(r"\p{Han}")


class EchoLLM:
    """Answer with the last user message, prefixed, streamed a few characters at a time.

    The Chinese prefix is used when the user's text contains a Han character, the other one
    otherwise.
    """

    def __init__(
        self,
        *,
        chinese_prefix: str = "你说的是：",
        prefix: str = "You said: ",
        delta_chars: int = 4,
    ):
        if delta_chars < 1:
            raise ValueError(f"delta_chars must be at least 1, got {delta_chars}")
        self._chinese_prefix = chinese_prefix
        self._prefix = prefix
        self._delta_chars = delta_chars

    async def stream_chat(self, messages: list[dict[str, str]]) -> AsyncGenerator[str, None]:
        validate_messages(messages)
        user_text = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "").strip()
        if not user_text:
            return
        prefix = self._chinese_prefix if _HAN.search(user_text) else self._prefix
        answer = prefix + user_text
        for start in range(0, len(answer), self._delta_chars):
            await asyncio.sleep(0)  # a real stream yields to the event loop between deltas
            yield answer[start : start + self._delta_chars]

    async def aclose(self) -> None:
        """Nothing to release; present so every model can be closed the same way."""
