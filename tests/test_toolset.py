"""The tool set of a turn, the model/tool rounds, the device MCP client as a tool source, built-ins."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.device.mcp_client import DeviceMcpClient, McpError
from gateway.llm.tool_calls import ToolCall
from gateway.tools import ToolError, ToolSet, ToolSpec, safe_tool_name
from gateway.tools.builtins import BuiltinTools, SessionControls
from gateway.tools.runner import Filler, ToolLoopSettings, ToolsRunning, answer_with_tools

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Source:
    def __init__(self, name: str, *tools: str, result: str = "done", delay_s: float = 0.0) -> None:
        self.name = name
        self.tools = tools
        self.result = result
        self.delay_s = delay_s
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.cancelled = False

    async def list_tools(self) -> list[ToolSpec]:
        return [ToolSpec(t, f"{t} of {self.name}") for t in self.tools]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls.append((name, arguments))
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.result == "raise":
            raise ToolError("the lamp is unplugged")
        return self.result


class Broken:
    name = "broken"

    async def list_tools(self) -> list[ToolSpec]:
        raise RuntimeError("server down")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        raise AssertionError("not listed, never called")


def test_safe_names_match_openai_and_stay_unique():
    assert safe_tool_name("self.audio_speaker.set_volume") == "self_audio_speaker_set_volume"
    assert safe_tool_name("x" * 80) == "x" * 64
    assert safe_tool_name("音量") == "__"
    assert safe_tool_name("") == "tool"
    taken = {"a_b", "a_b_2"}
    assert safe_tool_name("a.b", taken) == "a_b_3"
    long = safe_tool_name("y" * 70, {"y" * 64})
    assert OPENAI_NAME.match(long) and long.endswith("_2")


async def test_same_names_from_several_sources_map_back_to_each_source():
    device, server = (
        Source("device", "self.light.on", "get_time"),
        Source("server", "get_time", "self_light_on"),
    )
    tools = await ToolSet.gather([device, server, Broken()])
    names = [t["function"]["name"] for t in tools.openai_tools()]
    assert names == ["self_light_on", "get_time", "get_time_2", "self_light_on_2"]
    assert all(OPENAI_NAME.match(n) for n in names)
    assert (await tools.call("get_time_2", "{}")).ok
    assert server.calls == [("get_time", {})]
    assert (await tools.call("self_light_on", '{"level": 3}')).text == "done"
    assert device.calls == [("self.light.on", {"level": 3})]
    assert tools.original("self_light_on_2") == ("server", "self_light_on")


async def test_tools_are_bounded_and_results_cut():
    tools = ToolSet(
        [(Source("s", result="z" * 500), ToolSpec(f"t{i}")) for i in range(10)],
        max_tools=3,
        max_result_chars=100,
    )
    assert len(tools) == 3
    result = await tools.call("t0", "")
    assert result.ok and result.text.startswith("z" * 100) and len(result.text) < 120


@pytest.mark.parametrize(
    ("name", "arguments", "reason"),
    [
        ("nope", "{}", "no such tool"),
        ("t", '{"a": ', "not valid JSON"),
        ("t", "[1, 2]", "must be a JSON object"),
        ("t", '{"a": "' + "x" * 200 + '"}', "longer than 100"),
    ],
)
async def test_bad_calls_come_back_as_failed_results(name: str, arguments: str, reason: str):
    source = Source("s", "t")
    tools = ToolSet([(source, ToolSpec("t"))], max_argument_chars=100)
    result = await tools.call(name, arguments)
    assert not result.ok and reason in result.text
    assert source.calls == []


async def test_a_tool_error_is_reported_with_its_message():
    tools = ToolSet([(Source("s", result="raise"), ToolSpec("t"))])
    result = await tools.call("t", "{}")
    assert not result.ok and "the lamp is unplugged" in result.text


class ScriptedRounds:
    """A ToolCallingLLM without HTTP: each round yields the items of the next script (text deltas, and
    a list of calls last)."""

    def __init__(self, *rounds: list[Any]) -> None:
        self.rounds = list(rounds)
        self.requests: list[tuple[list[dict[str, Any]], str]] = []

    async def stream_round(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, tool_choice: str = "auto"
    ) -> AsyncIterator[str | list[ToolCall]]:
        self.requests.append((list(messages), tool_choice))
        for item in self.rounds.pop(0) if self.rounds else ["fine"]:
            yield item


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


async def test_rounds_are_bounded_and_the_last_forbids_calls():
    greedy = [[[ToolCall(str(i), "t", "{}")]] for i in range(10)]
    llm = ScriptedRounds(*greedy)
    source = Source("s", "t")
    tools = ToolSet([(source, ToolSpec("t"))])
    items = await collect(
        answer_with_tools(llm, [{"role": "user", "content": "go"}], tools, ToolLoopSettings(max_rounds=2))
    )
    assert len(source.calls) == 2
    assert [choice for _, choice in llm.requests] == ["auto", "auto", "none"]
    assert items == [ToolsRunning(), ToolsRunning()]
    last_messages = llm.requests[-1][0]
    assert [m["role"] for m in last_messages] == ["user", "assistant", "tool", "assistant", "tool"]


async def test_a_slow_call_gets_one_filler_and_a_timeout_result():
    llm = ScriptedRounds([[ToolCall("a", "t", "{}")]], ["sorry"])
    tools = ToolSet([(Source("s", delay_s=5), ToolSpec("t"))])
    settings = ToolLoopSettings(call_timeout_s=0.3, filler_after_s=0.05, filler="wait")
    items = await collect(answer_with_tools(llm, [{"role": "user", "content": "go"}], tools, settings))
    assert items == [ToolsRunning(), Filler("wait"), "sorry"]
    assert "no answer within 0.3 s" in llm.requests[1][0][-1]["content"]


async def test_closing_the_answer_cancels_the_running_call():
    source = Source("s", delay_s=30)
    llm = ScriptedRounds([[ToolCall("a", "t", "{}")]])
    tools = ToolSet([(source, ToolSpec("t"))])
    settings = ToolLoopSettings(filler_after_s=0.05, filler="wait")
    stream = answer_with_tools(llm, [{"role": "user", "content": "go"}], tools, settings)
    assert await anext(stream) == ToolsRunning()
    assert await anext(stream) == Filler("wait")  # suspended here while the call runs
    await stream.aclose()
    assert source.cancelled


async def test_device_mcp_errors_and_is_error_results_raise_with_the_message():
    sent: list[dict[str, Any]] = []

    async def send(payload: dict[str, Any]) -> None:
        sent.append(payload)

    client = DeviceMcpClient(send, timeout_s=2)
    answers = [
        {"error": {"message": "Unknown tool: x"}},  # no code, as the firmware sends it
        {"result": {"content": [{"type": "text", "text": "lamp broken"}], "isError": True}},
        {"result": {"content": [{"type": "text", "text": "true"}], "isError": False}},
    ]
    for answer in answers:
        call = asyncio.create_task(client.call_tool("x", {"a": 1}))
        await asyncio.sleep(0)
        client.handle({"jsonrpc": "2.0", "method": "notifications/state_changed", "params": {}})
        request = sent[-1]
        assert isinstance(request["id"], int) and request["params"] == {"name": "x", "arguments": {"a": 1}}
        client.handle({"jsonrpc": "2.0", "id": request["id"], **answer})
        if "error" in answer or answer["result"]["isError"]:
            with pytest.raises(McpError) as info:
                await call
            assert isinstance(info.value, ToolError)
            assert str(info.value) in ("Unknown tool: x", "lamp broken")
        else:
            assert await call == "true"
    assert len({p["id"] for p in sent}) == 3


async def test_builtins_tell_the_time_and_change_only_to_known_voices():
    voice: list[str] = []
    ended: list[bool] = []
    controls = SessionControls(
        voices=lambda: ["default", "alt"],
        set_voice=voice.append,
        end_conversation=lambda: ended.append(True),
        utc_offset_minutes=480,
        now=lambda: dt.datetime(2026, 11, 25, 19, 30, tzinfo=dt.UTC),
    )
    builtins = BuiltinTools(controls)
    assert [s.name for s in await builtins.list_tools()] == ["end_conversation", "change_voice", "get_time"]
    assert (await builtins.call_tool("get_time", {})).startswith(
        "2026-11-26 03:30, weekday: Thursday (星期四)"
    )
    with pytest.raises(ToolError, match="no voice 'bob'"):
        await builtins.call_tool("change_voice", {"voice": "bob"})
    await builtins.call_tool("change_voice", {"voice": "alt"})
    await builtins.call_tool("end_conversation", {})
    assert voice == ["alt"] and ended == [True]
    only_time = BuiltinTools(controls, ["get_time"])
    assert [s.name for s in await only_time.list_tools()] == ["get_time"]
    with pytest.raises(ToolError):
        await only_time.call_tool("end_conversation", {})
