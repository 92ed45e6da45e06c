"""Server-side MCP servers through the official `mcp` SDK: a stdio server written with the SDK
(tests/mcp_servers/demo_server.py) started by the pool, listed, called, its errors mapped to ToolError,
restarted after it is killed, and stopped at shutdown with no process left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gateway.config import ConfigError, MCPServerConfig, load_config
from gateway.tools.base import ToolError, ToolSource
from gateway.tools.mcp_servers import MCPServerPool, MCPServerSource
from scripts.device_sim import DeviceSimulator
from tests.gateway_server import running_gateway
from tests.scripted_llm import answer, call, scripted_llm
from tts_engine.backends.fake import FakeBackend

DEMO_SERVER = Path(__file__).parent / "mcp_servers" / "demo_server.py"


def demo_config(**extra) -> MCPServerConfig:
    return MCPServerConfig(command=sys.executable, args=[str(DEMO_SERVER)], **extra)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
async def demo() -> AsyncIterator[MCPServerSource]:
    pool = MCPServerPool({"demo": demo_config(call_timeout_s=5)}, start_timeout_s=30)
    await pool.start()
    try:
        yield pool.sources[0]
    finally:
        await pool.aclose()


async def test_tools_are_listed_and_called(demo: MCPServerSource):
    assert isinstance(demo, ToolSource) and demo.name == "mcp:demo"
    assert demo.connected, demo.last_error
    tools = {tool.name: tool for tool in await demo.list_tools()}
    assert {"lookup_weather", "fail", "whoami", "slow"} <= set(tools)
    weather = tools["lookup_weather"]
    assert weather.description == "The weather in a city today."
    assert weather.parameters["type"] == "object"
    assert weather.parameters["required"] == ["city"]
    assert await demo.call_tool("lookup_weather", {"city": "Paris"}) == "Paris: sunny, 25 degrees"


async def test_errors_become_tool_errors(demo: MCPServerSource):
    with pytest.raises(ToolError):  # the tool raised (the SDK reports isError)
        await demo.call_tool("fail", {"reason": "on purpose"})
    with pytest.raises(ToolError, match="nope"):  # no such tool
        await demo.call_tool("nope", {})
    with pytest.raises(ToolError):  # arguments that do not fit the schema
        await demo.call_tool("lookup_weather", {"town": 3})
    # the connection is still good after all that
    assert await demo.call_tool("lookup_weather", {"city": "Oslo"}) == "Oslo: sunny, 25 degrees"


async def test_a_call_past_its_timeout_fails_and_the_server_stays_usable():
    pool = MCPServerPool({"demo": demo_config(call_timeout_s=0.5)}, start_timeout_s=30)
    await pool.start()
    try:
        source = pool.sources[0]
        started = time.monotonic()
        with pytest.raises(ToolError, match="did not answer"):
            await source.call_tool("slow", {"seconds": 30})
        assert time.monotonic() - started < 5
        assert await source.call_tool("lookup_weather", {"city": "Rome"}) == "Rome: sunny, 25 degrees"
    finally:
        await pool.aclose()


async def test_a_cancelled_call_leaves_the_server_usable(demo: MCPServerSource):
    pending = asyncio.create_task(demo.call_tool("slow", {"seconds": 30}))  # a turn aborted mid-call
    await asyncio.sleep(0.3)
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert demo.connected
    assert await demo.call_tool("lookup_weather", {"city": "Nice"}) == "Nice: sunny, 25 degrees"


async def test_the_tool_list_is_refreshed_when_the_server_says_it_changed(demo: MCPServerSource):
    assert "greet" not in {tool.name for tool in await demo.list_tools()}
    assert await demo.call_tool("add_greeting_tool", {}) == "added"
    async with asyncio.timeout(10):
        while "greet" not in {tool.name for tool in await demo.list_tools()}:
            await asyncio.sleep(0.05)  # the refresh runs on the supervisor's task
    assert await demo.call_tool("greet", {"name": "Ada"}) == "hello Ada"


async def test_a_killed_server_fails_fast_then_is_restarted_and_usable(demo: MCPServerSource):
    pid = int(await demo.call_tool("whoami", {}))
    os.kill(pid, signal.SIGKILL)
    async with asyncio.timeout(5):  # the pipe's end is seen at once; calls then fail fast
        while demo.connected:
            await asyncio.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(ToolError, match="not running"):
        await demo.call_tool("lookup_weather", {"city": "Paris"})
    assert time.monotonic() - started < 0.5
    assert await demo.list_tools() == []  # a dead server offers nothing
    async with asyncio.timeout(30):
        await demo.wait_connected()
    assert demo.restarts >= 1
    new_pid = int(await demo.call_tool("whoami", {}))
    assert new_pid != pid
    assert await demo.call_tool("lookup_weather", {"city": "Lima"}) == "Lima: sunny, 25 degrees"


async def test_a_streamable_http_server_with_headers_and_a_restart():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def serve() -> asyncio.subprocess.Process:
        """The demo server on `port`, once uvicorn says it listens."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(DEMO_SERVER), "--http", str(port), stderr=asyncio.subprocess.PIPE
        )
        assert process.stderr is not None
        async with asyncio.timeout(30):
            while b"Uvicorn running on" not in (line := await process.stderr.readline()):
                assert line, "the demo server exited"
        drains.append(asyncio.create_task(process.stderr.read()))  # the rest of its log
        return process

    drains: list[asyncio.Task[bytes]] = []

    url = f"http://127.0.0.1:{port}/mcp"
    server = await serve()
    pool = MCPServerPool(
        {"web": MCPServerConfig(url=url, headers={"X-Api-Key": "k-123"})}, start_timeout_s=30
    )
    try:
        await pool.start()
        source = pool.sources[0]
        assert source.transport == "http" and source.connected, source.last_error
        assert await source.call_tool("lookup_weather", {"city": "Baku"}) == "Baku: sunny, 25 degrees"
        assert await source.call_tool("request_header", {"name": "X-Api-Key"}) == "k-123"

        server.kill()
        await server.wait()
        with pytest.raises(ToolError):  # the connection is refused: the call fails and a reconnect starts
            await source.call_tool("lookup_weather", {"city": "Baku"})
        server = await serve()
        async with asyncio.timeout(30):
            await source.wait_connected()
        assert await source.call_tool("lookup_weather", {"city": "Oslo"}) == "Oslo: sunny, 25 degrees"
    finally:
        await pool.aclose()
        if server.returncode is None:
            server.kill()
            await server.wait()


async def test_shutdown_leaves_no_child_process():
    pool = MCPServerPool({"a": demo_config(), "b": demo_config()}, start_timeout_s=30)
    await pool.start()
    pids = [int(await source.call_tool("whoami", {})) for source in pool.sources]
    assert all(alive(pid) for pid in pids)
    await pool.aclose()
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(ToolError):
        await pool.sources[0].call_tool("whoami", {})


async def test_a_server_that_cannot_start_does_not_block_start_up(tmp_path: Path):
    broken = tmp_path / "broken.py"
    broken.write_text("import sys\nprint('missing dependency', file=sys.stderr)\nsys.exit(3)\n")
    pool = MCPServerPool(
        {"broken": MCPServerConfig(command=sys.executable, args=[str(broken)]), "demo": demo_config()},
        start_timeout_s=30,
    )
    started = time.monotonic()
    await pool.start()
    try:
        assert time.monotonic() - started < 20
        broken_source, demo_source = pool.sources
        assert not broken_source.connected and broken_source.last_error
        with pytest.raises(ToolError, match="not running"):
            await broken_source.call_tool("anything", {})
        assert await demo_source.call_tool("lookup_weather", {"city": "Kyiv"}) == "Kyiv: sunny, 25 degrees"
        assert [s["connected"] for s in pool.status()] == [False, True]
    finally:
        await pool.aclose()


async def test_a_scripted_llm_calls_the_server_tool_in_a_device_turn():
    """The gateway starts the server at start-up, offers its tools in a device's turn, runs the LLM's
    call on it, gives the result back to the LLM, speaks the answer, and stops the server at shutdown."""
    overrides = {
        "session": {"enable_greeting": False},
        "tools": {"mcp_servers": {"demo": {"command": sys.executable, "args": [str(DEMO_SERVER)]}}},
    }
    scripts = [call("lookup_weather", '{"city": "Paris"}'), answer("巴黎今天晴，二十五度。")]
    async with scripted_llm(*scripts) as llm:
        overrides["llm"] = {"provider": "openai", "base_url": llm.base_url, "api_key": "", "model": "m"}
        async with running_gateway(overrides, backend=FakeBackend()) as gw:
            async with httpx.AsyncClient() as http:  # answered once start-up (servers included) is done
                health = (await http.get(f"{gw.url}/v1/health")).json()
            (status,) = health["mcp_servers"]
            assert status["name"] == "demo" and status["connected"] and status["tools"] >= 5
            pool = gw.services.mcp_servers
            assert pool is not None
            pid = int(await gw.call(pool.sources[0].call_tool("whoami", {})))
            sim = DeviceSimulator(gw.url)
            await sim.connect()
            await sim.listen_start("auto")
            turn = await sim.ask("巴黎今天天气怎么样？")
            await sim.close()
        assert not alive(pid)  # the gateway's shutdown stopped the server

    first, second = llm.requests
    offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert offered["lookup_weather"]["parameters"]["required"] == ["city"]
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "Paris: sunny, 25 degrees",
    }
    assert "".join(turn.sentences) == "巴黎今天晴，二十五度。"
    assert turn.frames


def test_config_takes_a_command_or_a_url():
    cfg = load_config(
        environ={},
        overrides={
            "tools": {
                "mcp_servers": {
                    "local": {"command": "uvx", "args": ["some-server"], "env": {"K": "v"}},
                    "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
                }
            }
        },
    )
    assert cfg.tools.mcp_servers["local"].args == ["some-server"]
    assert cfg.tools.mcp_servers["remote"].headers == {"Authorization": "Bearer x"}
    assert load_config(environ={}).tools.mcp_servers == {}
    for bad in (
        {},
        {"command": "x", "url": "http://h/mcp"},
        {"url": "ftp://h"},
        {"url": "http://h", "args": ["a"]},
    ):
        with pytest.raises(ConfigError, match="tools.mcp_servers"):
            load_config(environ={}, overrides={"tools": {"mcp_servers": {"s": bad}}})
