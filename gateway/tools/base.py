"""What a tool is, and what offers tools: the device's MCP server, server-side MCP servers, built-ins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["ToolError", "ToolSource", "ToolSpec"]


class ToolError(Exception):
    """A tool call failed: unknown tool, bad arguments, the tool's own error, no answer in time."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool as its source names it; ``parameters`` is the JSON Schema of its arguments object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@runtime_checkable
class ToolSource(Protocol):
    """Something that offers tools. ``name`` says where a tool came from in logs (``device``, ``builtin``)."""

    name: str

    async def list_tools(self) -> list[ToolSpec]:
        """The tools offered now (may be empty)."""
        ...

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run ``name`` with ``arguments``; the result as text. Raises ``ToolError`` on failure."""
        ...
