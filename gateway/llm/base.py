"""What the session needs from a chat model: a stream of text deltas for a list of messages."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol, runtime_checkable

__all__ = ["ChatLLM", "LLMError", "validate_messages"]


class LLMError(Exception):
    """The chat model could not answer: HTTP error, timeout, broken stream. The message says which."""


@runtime_checkable
class ChatLLM(Protocol):
    """A chat model that streams its answer.

    Implementations write ``stream_chat`` as an ``async def`` generator; it is declared here as a
    plain method returning an ``AsyncIterator`` because that is the type of an async generator.
    """

    def stream_chat(self, messages: list[dict[str, str]]) -> AsyncGenerator[str, None]:
        """Yield the answer to ``messages`` (OpenAI chat format) as text deltas.

        Raises ``LLMError`` when the model fails and ``ValueError`` for malformed ``messages``.
        """
        ...


def validate_messages(messages: list[dict[str, str]]) -> None:
    """Raise ValueError unless ``messages`` is a non-empty list of {"role": str, "content": str}."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{index}] must be a dict, not {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{index}] has no role")
        if not isinstance(content, str):
            raise ValueError(f"messages[{index}] content must be str")
