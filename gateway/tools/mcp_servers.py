"""Server-side MCP servers (`tools.mcp_servers`) as tool sources, through the official `mcp` SDK.

One `MCPServerSource` per configured server, all started once per process (Services.start) and shared
by every session. A supervisor task owns the SDK `Client` (its anyio task groups must be entered and
left by one task): it connects (stdio: runs the command; or streamable HTTP), lists the tools, then
waits until the connection is lost or the pool closes; on failure it connects again after a backoff
(0.5 s doubling to 30 s). Sessions call tools from their own tasks through the live client; while a
server is down its tool list is empty and its calls fail at once with ToolError, so a turn never
waits on a dead server. The tool list is cached and fetched again on `notifications/tools/list_changed`
(2025 protocol: a notification; 2026-07-28: a `subscriptions/listen` stream). Closing ends each
connection the SDK's way (stdin closed, then SIGTERM/SIGKILL to the process group): no orphans.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters, types
from mcp.client import Transport
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost

from gateway.config import MCPServerConfig, ToolsConfig
from gateway.tools.base import ToolError, ToolSpec
from gateway.tools.mcp_convert import result_text, tool_spec
from gateway.tools.mcp_stderr import StderrPipe

log = logging.getLogger(__name__)

CLIENT_INFO = types.Implementation(name="xiaozhi-gateway", version="0.1.0")
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0  # a connection that lived this long resets the backoff
CLOSE_TIMEOUT_S = 15.0  # the SDK's stdio shutdown is bounded (about 6.5 s); then the task is cancelled
MAX_TOOL_PAGES = 100


class _ConnectionLost(Exception):
    pass


# What a call raises when the connection itself is gone (the SDK's streams, the socket, HTTP).
_TRANSPORT_ERRORS = (
    OSError,
    httpx2.TransportError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
)


class MCPServerSource:
    """One MCP server as a ToolSource (``name`` is ``mcp:<server name>``)."""

    def __init__(self, server_name: str, cfg: MCPServerConfig) -> None:
        self.server_name = server_name
        self.name = f"mcp:{server_name}"
        self.transport = "stdio" if cfg.command else "http"
        self.restarts = 0
        self.last_error: str | None = None
        self._cfg = cfg
        self._client: Client | None = None
        self._tools: list[ToolSpec] = []
        self._wake = asyncio.Event()  # the supervisor has something to do (lost, refresh, close)
        self._attempted = asyncio.Event()  # the first connection attempt is over (either way)
        self._connected = asyncio.Event()
        self._lost: str | None = None
        self._refresh = False
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    # ---- ToolSource ----------------------------------------------------------------------------

    async def list_tools(self) -> list[ToolSpec]:
        """The tools of the live connection; none while the server is down or (re)starting."""
        return list(self._tools) if self._client is not None else []

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        client = self._client
        if client is None:
            raise ToolError(
                f"MCP server {self.server_name!r} is not running ({self.last_error or 'starting'})"
            )
        timeout = self._cfg.call_timeout_s
        try:
            async with asyncio.timeout(timeout):
                result = await client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except TimeoutError:
            raise ToolError(
                f"{name} on MCP server {self.server_name!r} did not answer within {timeout:g} s"
            ) from None
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self._lose(f"connection closed during {name}")
            raise ToolError(f"{name} on MCP server {self.server_name!r} failed: {exc.message}") from exc
        except _TRANSPORT_ERRORS as exc:  # the connection broke: reconnect
            self._lose(_describe(exc))
            raise ToolError(f"{name} on MCP server {self.server_name!r} failed: {_describe(exc)}") from exc
        except Exception as exc:  # noqa: BLE001 - anything else the SDK raises fails this call only
            raise ToolError(f"{name} on MCP server {self.server_name!r} failed: {_describe(exc)}") from exc
        if result.is_error:
            raise ToolError(result_text(result) or f"{name} failed")
        return result_text(result)

    # ---- lifecycle -----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._client is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name=f"mcp-server-{self.server_name}")

    async def wait_attempted(self) -> None:
        """Until the first connection attempt has succeeded or failed."""
        await self._attempted.wait()

    async def wait_connected(self) -> None:
        """Until the server is connected with its tool list (tests, start-up)."""
        await self._connected.wait()

    async def aclose(self) -> None:
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
        if not done:
            log.warning(
                "MCP server %r did not stop within %g s; cancelling", self.server_name, CLOSE_TIMEOUT_S
            )
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def status(self) -> dict[str, Any]:
        return {
            "name": self.server_name,
            "transport": self.transport,
            "connected": self.connected,
            "tools": len(self._tools) if self.connected else 0,
            "restarts": self.restarts,
            "last_error": self.last_error,
        }

    # ---- the supervisor ------------------------------------------------------------------------

    def _lose(self, reason: str) -> None:
        """The live connection is dead: calls fail fast from now on, and the supervisor reconnects."""
        if self._client is not None and self._lost is None:
            self._lost = reason
            self._client = None
            self._connected.clear()
            self._wake.set()

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        delay = BACKOFF_MIN_S
        while not self._closing:
            started = loop.time()
            try:
                await self._run_connection()
            except Exception as exc:  # noqa: BLE001 - whatever broke, the server is restarted
                self.last_error = _describe(exc)
            finally:
                self._client = None
                self._connected.clear()
                self._attempted.set()
            if self._closing:
                break
            if loop.time() - started >= STABLE_AFTER_S:
                delay = BACKOFF_MIN_S
            self.restarts += 1
            log.warning(
                "MCP server %r is down (%s); starting it again in %.1f s",
                self.server_name,
                self.last_error,
                delay,
            )
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()  # only close() sets it while no connection is live
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _run_connection(self) -> None:
        self._lost, self._refresh = None, False
        async with contextlib.AsyncExitStack() as stack:
            transport, stderr = await self._open_transport(stack)
            client = Client(
                transport,
                message_handler=self._on_message,
                read_timeout_seconds=self._cfg.call_timeout_s,
                client_info=CLIENT_INFO,
                cache=None,  # we keep the tool list ourselves, refreshed on list_changed
            )
            try:
                await stack.enter_async_context(client)
            except BaseException:
                if stderr is not None and stderr.recent():
                    self.last_error = f"stderr: {stderr.recent()}"
                raise
            finally:
                if stderr is not None:
                    stderr.spawned()
            self._tools = await self._fetch_tools(client)
            self._client = client
            self.last_error = None
            self._connected.set()
            self._attempted.set()
            log.info(
                "MCP server %r connected (%s, protocol %s): %d tools",
                self.server_name,
                self.transport,
                client.protocol_version,
                len(self._tools),
            )
            listener = self._listen_for_changes(client)
            try:
                await self._serve(client)
            finally:
                self._client = None  # calls fail fast while the connection closes
                self._connected.clear()
                if listener is not None:
                    listener.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await listener

    async def _serve(self, client: Client) -> None:
        """Wait for work until the connection is lost or the pool closes."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            if self._lost is not None:
                raise _ConnectionLost(self._lost)
            if self._refresh:
                self._refresh = False
                try:
                    self._tools = await self._fetch_tools(client)
                    log.info("MCP server %r tools changed: %d tools", self.server_name, len(self._tools))
                except Exception as exc:  # noqa: BLE001 - the old list stays; a dead server is seen by its calls
                    log.warning(
                        "MCP server %r: listing its tools failed: %s", self.server_name, _describe(exc)
                    )

    async def _open_transport(self, stack: contextlib.AsyncExitStack) -> tuple[Transport, StderrPipe | None]:
        cfg = self._cfg
        if cfg.command:
            stderr = StderrPipe(self.server_name)
            stack.callback(stderr.close)
            params = StdioServerParameters(
                command=cfg.command, args=cfg.args, env=cfg.env or None, cwd=cfg.cwd or None
            )
            reader = asyncio.create_task(stderr.read(lambda: self._lose_process(stderr)))
            stack.push_async_callback(_cancel, reader)
            return stdio_client(params, errlog=stderr.errlog), stderr
        http = httpx2.AsyncClient(headers=cfg.headers, timeout=httpx2.Timeout(30.0, read=300.0))
        await stack.enter_async_context(http)
        return streamable_http_client(cfg.url, http_client=http), None

    def _lose_process(self, stderr: StderrPipe) -> None:
        tail = stderr.recent()
        self._lose("the process exited" + (f"; stderr: {tail}" if tail else ""))

    async def _fetch_tools(self, client: Client) -> list[ToolSpec]:
        tools: list[ToolSpec] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools += [tool_spec(tool) for tool in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def _on_message(self, message: Any) -> None:
        """Server notifications of a 2025-protocol connection (and transport errors, which the calls see)."""
        if isinstance(message, types.ToolListChangedNotification):
            self._want_refresh()
        elif isinstance(message, Exception):
            log.debug("MCP server %r: %s", self.server_name, _describe(message))

    def _want_refresh(self) -> None:
        self._refresh = True
        self._wake.set()

    def _listen_for_changes(self, client: Client) -> asyncio.Task[None] | None:
        """On a 2026-07-28 connection, list changes come as `subscriptions/listen` events."""
        tools_cap = client.server_capabilities.tools
        if tools_cap is None or not tools_cap.list_changed:
            return None

        async def listen() -> None:
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    async for _event in subscription:
                        self._want_refresh()
            except ListenNotSupportedError:
                pass  # a 2025 connection: the notification arrives through _on_message
            except SubscriptionLost as exc:
                self._lose(f"change subscription lost: {exc}")
            except Exception as exc:  # noqa: BLE001 - no change events; the list stays as fetched
                log.info("MCP server %r offers no tool change events: %s", self.server_name, _describe(exc))

        return asyncio.create_task(listen(), name=f"mcp-listen-{self.server_name}")


class MCPServerPool:
    """Every configured MCP server; started at start-up, closed at shutdown."""

    def __init__(self, servers: Mapping[str, MCPServerConfig], start_timeout_s: float = 10.0) -> None:
        self.sources = [MCPServerSource(name, cfg) for name, cfg in servers.items() if cfg.enabled]
        self.start_timeout_s = start_timeout_s

    @classmethod
    def from_config(cls, cfg: ToolsConfig) -> MCPServerPool:
        return cls(cfg.mcp_servers, cfg.mcp_start_timeout_s)

    async def start(self) -> None:
        """Start every server and wait (at most start_timeout_s) for each first attempt to end."""
        if not self.sources:
            return
        for source in self.sources:
            source.start()
        waits = [asyncio.ensure_future(source.wait_attempted()) for source in self.sources]
        _, pending = await asyncio.wait(waits, timeout=self.start_timeout_s)
        for wait in pending:
            wait.cancel()
        for source in self.sources:
            if not source.connected:
                log.warning(
                    "MCP server %r is not available yet (%s); retrying in the background",
                    source.server_name,
                    source.last_error or "still starting",
                )

    async def aclose(self) -> None:
        async with asyncio.TaskGroup() as group:
            for source in self.sources:
                group.create_task(source.aclose())

    def status(self) -> list[dict[str, Any]]:
        return [source.status() for source in self.sources]


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _describe(exc: BaseException) -> str:
    """One line for a failure; an exception group (anyio task groups) is described by its first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, ToolError | _ConnectionLost) else text
