"""Function calling in OpenAI chat format: streamed ``tool_calls`` deltas -> whole calls.

A streamed answer that calls tools sends, in ``choices[0].delta.tool_calls``, pieces such as
``{"index": 0, "id": "call_1", "function": {"name": "get_time", "arguments": ""}}`` followed by
``{"index": 0, "function": {"arguments": "{\\"vol"}}``. Pieces of several calls may interleave;
``index`` says which call a piece belongs to, and string fields are concatenated in order (the same
rule as the ``openai`` SDK's stream accumulator). Bad pieces are skipped, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["ToolCall", "ToolCallAssembler", "ToolCallingLLM", "assistant_message", "tool_message"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for; ``arguments`` is the JSON text as the model wrote it."""

    id: str
    name: str
    arguments: str


@runtime_checkable
class ToolCallingLLM(Protocol):
    """A chat model that can call tools: one request/answer round at a time."""

    def stream_round(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, tool_choice: str = "auto"
    ) -> AsyncGenerator[str | list[ToolCall], None]:
        """Yield the answer's text deltas and, last, the list of tool calls if the model made any.

        Raises ``LLMError`` when the model fails.
        """
        ...


class ToolCallAssembler:
    """Collects ``delta.tool_calls`` pieces of one streamed answer into whole calls.

    At most ``max_calls`` calls are kept; a call's name and arguments stop growing past
    ``max_chars`` (an oversized call is then refused by the tool set, not sent truncated).
    """

    def __init__(self, *, max_calls: int = 8, max_chars: int = 8192) -> None:
        self._max_calls = max_calls
        self._max_chars = max_chars
        self._ids: dict[int, str] = {}
        self._names: dict[int, list[str]] = {}
        self._args: dict[int, list[str]] = {}
        self._sizes: dict[int, int] = {}
        self.skipped = 0  # malformed pieces and calls beyond max_calls

    def __bool__(self) -> bool:
        return bool(self._names)

    def feed(self, pieces: Any) -> None:
        """Add one chunk's ``delta.tool_calls`` (a list of pieces)."""
        if not isinstance(pieces, list):
            self.skipped += 1
            return
        for piece in pieces:
            self._add(piece)

    def _add(self, piece: Any) -> None:
        index = piece.get("index", 0) if isinstance(piece, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            self.skipped += 1
            return
        if index not in self._names:
            if len(self._names) >= self._max_calls:
                self.skipped += 1
                return
            self._names[index], self._args[index], self._sizes[index] = [], [], 0
        call_id = piece.get("id")
        if isinstance(call_id, str) and call_id and index not in self._ids:
            self._ids[index] = call_id
        function = piece.get("function")
        if not isinstance(function, dict):
            return
        for key, parts in (("name", self._names[index]), ("arguments", self._args[index])):
            text = function.get(key)
            if isinstance(text, str) and text:
                if self._sizes[index] <= self._max_chars:  # one piece past the limit marks it oversized
                    parts.append(text)
                    self._sizes[index] += len(text)

    def calls(self) -> list[ToolCall]:
        """The assembled calls in index order; a call without an id gets one."""
        return [
            ToolCall(
                id=self._ids.get(index) or f"call_{index}",
                name="".join(self._names[index]),
                arguments="".join(self._args[index]),
            )
            for index in sorted(self._names)
        ]


def assistant_message(content: str, calls: list[ToolCall]) -> dict[str, Any]:
    """The assistant's turn that asked for ``calls``, to send back with their results."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ],
    }


def tool_message(call: ToolCall, result: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "content": result}
