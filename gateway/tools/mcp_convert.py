"""What the `mcp` SDK returns, in our terms: its `Tool` as a ToolSpec, a `CallToolResult` as text."""

from __future__ import annotations

import json

from mcp import types

from gateway.tools.base import ToolSpec

MAX_RESULT_CHARS = 16000  # a result longer than this is cut (it goes into the LLM's context)


def tool_spec(tool: types.Tool) -> ToolSpec:
    """The SDK's tool description as a ToolSpec (the input schema is a JSON Schema object already)."""
    schema = dict(tool.input_schema) if tool.input_schema else {}
    schema.setdefault("type", "object")
    return ToolSpec(name=tool.name, description=tool.description or tool.title or "", parameters=schema)


def _block_text(block: object) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return resource.text
        return f"[binary resource {resource.uri}]"
    if isinstance(block, types.ResourceLink):
        return f"[resource {block.uri}]"
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type} {block.mime_type}]"
    return f"[{getattr(block, 'type', 'content')}]"


def result_text(result: types.CallToolResult) -> str:
    """The result's content as one text: text blocks as they are, other blocks named; the structured
    content as JSON when there is no content; cut at MAX_RESULT_CHARS."""
    text = "\n".join(_block_text(block) for block in result.content)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + " …(cut)"
    return text
