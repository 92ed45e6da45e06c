"""The tools of one turn: several sources merged under unambiguous, OpenAI-safe names.

OpenAI function names must match ``^[a-zA-Z0-9_-]{1,64}$``; device tools are named like
``self.audio_speaker.set_volume``. Each tool gets a safe name (characters outside the set become
``_``; a name already taken gets ``_2``, ``_3``... ) and the set maps it back to its source and
original name. Sources come in priority order: the first one to offer a name keeps the plain form.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.tools.base import ToolError, ToolSource, ToolSpec

__all__ = ["ToolResult", "ToolSet", "safe_tool_name"]

log = logging.getLogger(__name__)

MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def safe_tool_name(name: str, taken: Iterable[str] = ()) -> str:
    """``name`` made to match ``^[a-zA-Z0-9_-]{1,64}$`` and differ from every name in ``taken``."""
    base = _UNSAFE.sub("_", name)[:MAX_NAME_CHARS] or "tool"
    used = set(taken)
    candidate, n = base, 1
    while candidate in used:
        n += 1
        suffix = f"_{n}"
        candidate = base[: MAX_NAME_CHARS - len(suffix)] + suffix
    return candidate


@dataclass(frozen=True)
class ToolResult:
    """What goes back to the LLM for one call; ``ok`` is False when the call failed."""

    text: str
    ok: bool


@dataclass(frozen=True)
class _Entry:
    source: ToolSource
    spec: ToolSpec


class ToolSet:
    """Tools offered to the LLM in one turn, and the way back from a safe name to its source."""

    def __init__(
        self,
        specs: Iterable[tuple[ToolSource, ToolSpec]] = (),
        *,
        max_tools: int = 64,
        max_argument_chars: int = 8192,
        max_result_chars: int = 4000,
    ) -> None:
        self._max_argument_chars = max_argument_chars
        self._max_result_chars = max_result_chars
        self._entries: dict[str, _Entry] = {}
        dropped = 0
        for source, spec in specs:
            if len(self._entries) >= max_tools:
                dropped += 1
                continue
            safe = safe_tool_name(spec.name, self._entries)
            self._entries[safe] = _Entry(source, spec)
        if dropped:
            log.warning("%d tools left out: a turn offers at most %d", dropped, max_tools)

    @classmethod
    async def gather(
        cls, sources: Iterable[ToolSource], *, list_timeout_s: float = 2.0, **limits: int
    ) -> ToolSet:
        """List every source's tools (in parallel, each bounded by ``list_timeout_s``); a source that
        fails or is slow is left out of this turn with a log line."""
        sources = list(sources)

        async def listed(source: ToolSource) -> list[ToolSpec]:
            try:
                async with asyncio.timeout(list_timeout_s):
                    return list(await source.list_tools())
            except Exception as exc:  # any source's failure only costs its own tools
                log.warning("tools of %s not listed: %s: %s", source.name, type(exc).__name__, exc)
                return []

        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(listed(source)) for source in sources]
        return cls(
            ((source, spec) for source, task in zip(sources, tasks, strict=True) for spec in task.result()),
            **limits,
        )

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def original(self, safe_name: str) -> tuple[str, str] | None:
        """(source name, tool name as the source knows it) for a safe name; None if unknown."""
        entry = self._entries.get(safe_name)
        return (entry.source.name, entry.spec.name) if entry else None

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools in OpenAI chat-completions ``tools`` format."""
        out = []
        for safe, entry in self._entries.items():
            params = entry.spec.parameters
            if not isinstance(params, dict) or params.get("type") != "object":
                params = _EMPTY_SCHEMA
            function = {
                "name": safe,
                "description": entry.spec.description[:MAX_DESCRIPTION_CHARS],
                "parameters": params,
            }
            out.append({"type": "function", "function": function})
        return out

    async def call(self, safe_name: str, arguments_json: str) -> ToolResult:
        """Run one call the LLM asked for. Failures (unknown tool, bad or oversized arguments, the
        tool's own error) come back as a result that says so, for the LLM to tell the user."""
        entry = self._entries.get(safe_name)
        if entry is None:
            return self._failed(safe_name, "no such tool")
        if len(arguments_json) > self._max_argument_chars:
            return self._failed(safe_name, f"arguments longer than {self._max_argument_chars} characters")
        try:
            arguments = json.loads(arguments_json) if arguments_json.strip() else {}
        except json.JSONDecodeError as exc:
            return self._failed(safe_name, f"arguments are not valid JSON ({exc.msg})")
        if not isinstance(arguments, dict):
            return self._failed(safe_name, "arguments must be a JSON object")
        try:
            text = await entry.source.call_tool(entry.spec.name, arguments)
        except ToolError as exc:
            return self._failed(safe_name, str(exc) or type(exc).__name__, entry)
        except Exception as exc:  # a source's bug must not end the turn
            log.exception("tool %s of %s raised", entry.spec.name, entry.source.name)
            return self._failed(safe_name, f"internal error ({type(exc).__name__})", entry)
        log.info("tool %s of %s called", entry.spec.name, entry.source.name)
        return ToolResult(self._truncate(str(text)), ok=True)

    def failed(self, safe_name: str, reason: str) -> ToolResult:
        """The result for a call that could not finish (e.g. it timed out)."""
        return self._failed(safe_name, reason, self._entries.get(safe_name))

    def _failed(self, safe_name: str, reason: str, entry: _Entry | None = None) -> ToolResult:
        where = f"{entry.spec.name} of {entry.source.name}" if entry else repr(safe_name[:MAX_NAME_CHARS])
        log.warning("tool call %s failed: %s", where, reason)
        return ToolResult(self._truncate(f"Error: the tool call failed: {reason}"), ok=False)

    def _truncate(self, text: str) -> str:
        if len(text) <= self._max_result_chars:
            return text
        return text[: self._max_result_chars] + "...(truncated)"
