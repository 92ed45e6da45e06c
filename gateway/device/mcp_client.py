"""The server side of MCP over the device socket: the device is the MCP server.

After our hello reply we send `initialize`, then `tools/list` following `nextCursor`.
Request ids are unique integers (the firmware drops string ids).

`initialize` always carries `capabilities.vision {url, token}`, as the incumbent
server sends it: the firmware gives both to its camera's "explain" call, and
clients such as xiaozhi-sdk read them unconditionally. An empty url means no
vision endpoint (the firmware then leaves its camera's explain URL unset).

The client is the session's ``ToolSource`` for the device's tools (gateway/tools): `tools/call`
answers with `error` (the firmware sends only `message`, no `code`) or with `isError: true` both
raise ``McpError`` carrying the device's message. Device `notifications/*` are logged and dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from gateway.tools.base import ToolError, ToolSpec

log = logging.getLogger(__name__)

PROTOCOL_VERSION = "2024-11-05"
MAX_TOOL_PAGES = 32


LIST_WAIT_S = 2.0  # how long a turn waits for a tools/list still under way
MAX_TOOLS = 256


class McpError(ToolError):
    """The device answered with an error, or did not answer in time."""


@dataclass(frozen=True)
class VisionCapability:
    """Where the device's camera sends a photo to be explained, and the bearer token it sends."""

    url: str = ""
    token: str = ""


class DeviceMcpClient:
    def __init__(
        self,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        *,
        timeout_s: float = 30.0,
        vision: VisionCapability | None = None,
    ) -> None:
        self._send = send
        self._timeout_s = timeout_s
        self._vision = vision or VisionCapability()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.tools: list[dict[str, Any]] = []
        self.server_info: dict[str, Any] = {}
        self.ready = asyncio.Event()  # initialize and tools/list succeeded
        self.started = asyncio.Event()  # ... or failed
        self._waited = False

    name = "device"

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        req_id = next(self._ids)
        payload: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            payload["params"] = params
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        try:
            await self._send(payload)
            async with asyncio.timeout(self._timeout_s):
                return await fut
        except TimeoutError:
            raise McpError(f"device did not answer {method} within {self._timeout_s:g} s") from None
        finally:
            self._pending.pop(req_id, None)

    def handle(self, payload: dict[str, Any]) -> None:
        """Route a message from the device; requests and notifications are ignored."""
        req_id = payload.get("id")
        method = payload.get("method")
        if isinstance(method, str):
            if method.startswith("notifications"):
                log.info("device MCP notification %s", method[:80])
            else:
                log.debug("device MCP request %s ignored", method[:80])
            return
        if not isinstance(req_id, int) or ("result" not in payload and "error" not in payload):
            return
        fut = self._pending.get(req_id)
        if fut is None or fut.done():
            log.debug("MCP response for unknown id %r ignored", req_id)
            return
        if "error" in payload:
            err = payload["error"]
            message = err.get("message", "unknown error") if isinstance(err, dict) else str(err)
            fut.set_exception(McpError(str(message)))
        else:
            result = payload["result"]
            fut.set_result(result if isinstance(result, dict) else {"value": result})

    async def start(self) -> None:
        """initialize + tools/list; failures are logged, never fatal to the session."""
        try:
            init = await self.request(
                "initialize",
                {
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {
                        "roots": {"listChanged": True},
                        "sampling": {},
                        "vision": asdict(self._vision),
                    },
                    "clientInfo": {"name": "XiaozhiGateway", "version": "0.1.0"},
                },
            )
            self.server_info = init.get("serverInfo", {}) if isinstance(init, dict) else {}
            cursor: str | None = None
            for _ in range(MAX_TOOL_PAGES):
                params = {"cursor": cursor} if cursor else None
                page = await self.request("tools/list", params)
                tools = page.get("tools", [])
                if isinstance(tools, list):
                    self.tools.extend(
                        t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)
                    )
                    del self.tools[MAX_TOOLS:]
                cursor = page.get("nextCursor") or None
                if not isinstance(cursor, str) or not cursor:
                    break
            self.ready.set()
        except McpError as exc:
            log.info("device MCP unavailable: %s", exc)
        finally:
            self.started.set()

    async def list_tools(self) -> list[ToolSpec]:
        """The device's tools; the first turn waits (briefly) for a tools/list still under way."""
        if not self.started.is_set() and not self._waited:
            self._waited = True  # a device slow to answer costs one turn the wait, not every turn
            try:
                async with asyncio.timeout(LIST_WAIT_S):
                    await self.started.wait()
            except TimeoutError:
                return []
        specs = []
        for tool in self.tools:
            schema = tool.get("inputSchema")
            description = tool.get("description")
            specs.append(
                ToolSpec(
                    name=tool["name"],
                    description=description if isinstance(description, str) else "",
                    parameters=schema if isinstance(schema, dict) else {"type": "object", "properties": {}},
                )
            )
        return specs

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        """The text of the tool's result; ``McpError`` for an error answer or ``isError: true``."""
        result = await self.request("tools/call", {"name": name, "arguments": arguments or {}})
        content = result.get("content")
        texts = []
        if isinstance(content, list):
            texts = [
                str(c.get("text", ""))
                for c in content
                if isinstance(c, dict) and c.get("type", "text") == "text"
            ]
        text = "\n".join(t for t in texts if t)
        if result.get("isError") is True:
            raise McpError(text or f"the device reported an error calling {name}")
        return text

    @property
    def pending_requests(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._pending)

    def cancel_all(self) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        self._pending.clear()
