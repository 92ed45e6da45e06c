"""The chat history of one device session, kept short enough to send with every turn."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["Conversation", "SUMMARY_HEADER"]

SUMMARY_HEADER = "What you remember of earlier conversations with this user:"


class Conversation:
    """System prompt plus the last ``max_turns`` (user, assistant) exchanges.

    Only what the device actually said belongs in the history: after a barge-in, pass the part of
    the answer that was spoken. A turn with no spoken answer is not stored, so user and assistant
    messages always alternate (some chat templates reject anything else).
    """

    def __init__(self, system_prompt: str, max_turns: int = 20):
        if not isinstance(system_prompt, str):
            raise TypeError(f"system_prompt must be str, not {type(system_prompt).__name__}")
        if max_turns < 0:
            raise ValueError(f"max_turns must not be negative, got {max_turns}")
        self._system_prompt = system_prompt.strip()
        self._turns: deque[tuple[str, str]] = deque(maxlen=max_turns)
        self.summary = ""  # of earlier sessions (gateway/llm/memory.py); sent inside the system message

    @property
    def system_prompt(self) -> str:
        return self._system_prompt

    @system_prompt.setter
    def system_prompt(self, prompt: str) -> None:
        """Another system prompt from the next message list on (a device's agent changed)."""
        if not isinstance(prompt, str):
            raise TypeError(f"system_prompt must be str, not {type(prompt).__name__}")
        self._system_prompt = prompt.strip()

    @property
    def turns(self) -> tuple[tuple[str, str], ...]:
        """Stored (user, assistant) exchanges, oldest first."""
        return tuple(self._turns)

    def messages_for(self, user_text: str) -> list[dict[str, str]]:
        """Messages to send for a new user utterance: system prompt, history, then ``user_text``."""
        user_text = _require_text(user_text, "user_text")
        messages: list[dict[str, str]] = []
        # one system message: some chat templates reject a second one
        system = "\n\n".join(
            part
            for part in (self._system_prompt, self.summary and f"{SUMMARY_HEADER}\n{self.summary}")
            if part
        )
        if system:
            messages.append({"role": "system", "content": system})
        for user, assistant in self._turns:
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": assistant})
        messages.append({"role": "user", "content": user_text})
        return messages

    def add_turn(self, user_text: str, assistant_text: str) -> None:
        """Remember an exchange; the oldest ones are dropped beyond ``max_turns``."""
        user_text = _require_text(user_text, "user_text")
        if not isinstance(assistant_text, str):
            raise TypeError(f"assistant_text must be str, not {type(assistant_text).__name__}")
        assistant_text = assistant_text.strip()
        if assistant_text:
            self._turns.append((user_text, assistant_text))

    def restore(self, summary: str, turns: Iterable[tuple[str, str]]) -> None:
        """Replace the history by remembered ``turns`` (oldest first) and a ``summary`` of older ones."""
        self.clear()
        self.summary = summary.strip()
        for user_text, assistant_text in turns:
            if user_text.strip():
                self.add_turn(user_text, assistant_text)

    def clear(self) -> None:
        """Forget the history and the summary; the system prompt stays."""
        self._turns.clear()
        self.summary = ""


def _require_text(text: str, name: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be str, not {type(text).__name__}")
    text = text.strip()
    if not text:
        raise ValueError(f"{name} must not be empty")
    return text
