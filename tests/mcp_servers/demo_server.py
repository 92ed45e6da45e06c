"""An MCP server written with the official `mcp` SDK, for tests/test_mcp_servers.py: over stdio (no
arguments; started by the gateway's MCP server pool) or streamable HTTP (`--http PORT`, on loopback)."""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("demo")


@server.tool()
def lookup_weather(city: str) -> str:
    """The weather in a city today."""
    return f"{city}: sunny, 25 degrees"


@server.tool()
def fail(reason: str = "no reason") -> str:
    """A tool that always fails."""
    raise ValueError(f"the demo tool failed: {reason}")


@server.tool()
def whoami() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
async def slow(seconds: float) -> str:
    """Answers after `seconds`."""
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def request_header(name: str, ctx: Context) -> str:
    """A header of the HTTP request that carried this call ("" over stdio)."""
    return (ctx.headers or {}).get(name.lower(), "")


@server.tool()
async def add_greeting_tool(ctx: Context) -> str:
    """Adds a `greet` tool and tells the client that the tool list changed."""
    server.add_tool(lambda name: f"hello {name}", name="greet", description="Greets someone.")
    await ctx.notify_tools_changed()  # 2026-07-28 clients: a subscriptions/listen event
    await ctx.session.send_tool_list_changed()  # 2025 clients: notifications/tools/list_changed
    return "added"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
