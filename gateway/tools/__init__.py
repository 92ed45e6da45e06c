"""Tools the LLM may call: the device's MCP tools, server-side MCP servers and built-ins.

``ToolSource`` (base.py) is what offers tools; a turn merges its sources into a ``ToolSet``
(toolset.py) with OpenAI-safe, unambiguous names; runner.py runs the model/tool rounds; builtins.py
has the gateway's own tools. Server-side MCP servers reach the turns through ``Services.tool_sources``.
"""

from gateway.tools.base import ToolError, ToolSource, ToolSpec
from gateway.tools.toolset import ToolResult, ToolSet, safe_tool_name

__all__ = ["ToolError", "ToolResult", "ToolSet", "ToolSource", "ToolSpec", "safe_tool_name"]
