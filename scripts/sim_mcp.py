"""The device simulator's MCP server: what the firmware (main/mcp_server.cc) answers over the socket.

`initialize`, paged `tools/list` (the cursor is the next tool's name) and `tools/call`. Calls run in
their own tasks, so a slow tool does not hold up the simulator's reader (the firmware runs tools on
its main loop). A handler's return value is stringified into the result text as the firmware does;
`McpToolError` becomes an error answer with a message and no code, as the firmware sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

# Two tools as the firmware declares them: pass `mcp_tools=FIRMWARE_TOOLS` to the simulator.
STATUS_TOOL = {
    "name": "self.get_device_status",
    "description": "Provides the real-time information of the device (speaker volume, screen, battery, network).",
    "inputSchema": {"type": "object", "properties": {}},
}
VOLUME_TOOL = {
    "name": "self.audio_speaker.set_volume",
    "description": "Set the volume of the audio speaker.",
    "inputSchema": {
        "type": "object",
        "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["volume"],
    },
}
FIRMWARE_TOOLS = [STATUS_TOOL, VOLUME_TOOL]

McpHandler = Callable[[dict[str, Any]], Awaitable[Any]]
Reply = Callable[[dict[str, Any]], Awaitable[None]]


class McpToolError(Exception):
    """Raised by a tool handler: answered with a JSON-RPC error (message only, as the firmware)."""


class SimMcpServer:
    """Answers the gateway's MCP requests; records them and the tool calls."""

    def __init__(self, tools: list[dict[str, Any]] | None, reply: Reply, *, page_size: int = 2) -> None:
        self.tools = tools  # None: the device has no MCP
        self.page_size = page_size
        self._reply = reply
        self.requests: list[dict[str, Any]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (tool, arguments) of each tools/call
        self.volume = 70
        # tools/call handlers by tool name; tests may add or replace them
        self.handlers: dict[str, McpHandler] = {
            STATUS_TOOL["name"]: self._device_status,
            VOLUME_TOOL["name"]: self._set_volume,
        }
        self._tasks: set[asyncio.Task[None]] = set()

    async def answer(self, payload: dict[str, Any]) -> None:
        self.requests.append(payload)
        if self.tools is None or "id" not in payload:
            return
        method = payload.get("method")
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": "2024-11-05",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "sim", "version": "2.4.2"},
            }
        elif method == "tools/list":
            names = [t["name"] for t in self.tools]
            cursor = (payload.get("params") or {}).get("cursor")
            start = names.index(cursor) if cursor in names else 0
            page = self.tools[start : start + self.page_size]
            nxt = names[start + self.page_size] if start + self.page_size < len(names) else ""
            result = {"tools": page, "nextCursor": nxt}
        elif method == "tools/call":
            task = asyncio.create_task(self._call(payload["id"], payload.get("params") or {}))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        else:
            await self._reply(
                {"jsonrpc": "2.0", "id": payload["id"], "error": {"message": f"Unknown method: {method}"}}
            )
            return
        await self._reply({"jsonrpc": "2.0", "id": payload["id"], "result": result})

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _call(self, req_id: int, params: dict[str, Any]) -> None:
        name, arguments = str(params.get("name")), params.get("arguments") or {}
        self.calls.append((name, arguments))
        handler = self.handlers.get(name)
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id}
        if handler is None or name not in {t["name"] for t in self.tools or []}:
            reply["error"] = {"message": f"Unknown tool: {name}"}
        else:
            try:
                value = await handler(arguments)
            except McpToolError as exc:
                reply["error"] = {"message": str(exc)}
            else:
                text = value if isinstance(value, str) else json.dumps(value)
                reply["result"] = {"content": [{"type": "text", "text": text}], "isError": False}
        with contextlib.suppress(Exception):  # the socket may be gone by then
            await self._reply(reply)

    async def _device_status(self, _arguments: dict[str, Any]) -> Any:
        return {"audio_speaker": {"volume": self.volume}, "network": {"type": "wifi"}}

    async def _set_volume(self, arguments: dict[str, Any]) -> Any:
        volume = arguments.get("volume")
        if not isinstance(volume, int) or isinstance(volume, bool) or not 0 <= volume <= 100:
            raise McpToolError("Invalid volume")
        self.volume = volume
        return True
