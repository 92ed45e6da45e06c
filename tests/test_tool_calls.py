"""Streamed tool-call pieces -> whole calls, and the OpenAI client's rounds with tools."""

from __future__ import annotations

import json

import httpx

from gateway.llm.openai_chat import OpenAIChatLLM
from gateway.llm.tool_calls import ToolCall, ToolCallAssembler
from tests.scripted_llm import finish, text, tool


def pieces(chunk: dict) -> list:
    return chunk["choices"][0]["delta"]["tool_calls"]


def test_interleaved_calls_are_kept_apart_by_index():
    calls = ToolCallAssembler()
    for chunk in [
        tool(0, id="a", name="get_time", arguments=""),
        tool(1, id="b", name="self_audio_speaker_set_volume", arguments='{"vo'),
        tool(0, arguments="{}"),
        tool(1, arguments='lume": 5'),
        tool(1, arguments="0}"),
    ]:
        calls.feed(pieces(chunk))
    assert calls.calls() == [
        ToolCall("a", "get_time", "{}"),
        ToolCall("b", "self_audio_speaker_set_volume", '{"volume": 50}'),
    ]


def test_arguments_split_inside_a_token_and_an_escape_join_exactly():
    arguments = json.dumps({"text": '音量 "50"', "n": 12.5})  # \u escapes, quotes, a decimal
    calls = ToolCallAssembler()
    calls.feed(pieces(tool(0, id="x", name="say")))
    for i in range(len(arguments)):
        calls.feed(pieces(tool(0, arguments=arguments[i])))
    [call] = calls.calls()
    assert json.loads(call.arguments) == {"text": '音量 "50"', "n": 12.5}


def test_calls_come_out_in_index_order_and_get_an_id_when_the_server_sent_none():
    calls = ToolCallAssembler()
    calls.feed([{"index": 2, "function": {"name": "b", "arguments": "{}"}}])
    calls.feed([{"index": 0, "function": {"name": "a", "arguments": "{}"}}])
    assert [(c.id, c.name) for c in calls.calls()] == [("call_0", "a"), ("call_2", "b")]


def test_malformed_pieces_are_skipped_not_fatal():
    calls = ToolCallAssembler()
    calls.feed("not a list")
    calls.feed([None, 7, {"index": "0"}, {"index": -1}, {"index": True}, {"index": 0, "function": "x"}])
    calls.feed([{"index": 0, "id": "ok", "function": {"name": "f", "arguments": None}}])
    assert calls.skipped == 6
    assert calls.calls() == [ToolCall("ok", "f", "")]


def test_malformed_json_arguments_are_kept_as_sent():
    calls = ToolCallAssembler()
    calls.feed(pieces(tool(0, id="a", name="f", arguments='{"volume": ')))
    assert calls.calls()[0].arguments == '{"volume": '  # the tool set refuses it (test_toolset.py)


def test_calls_and_their_size_are_bounded():
    calls = ToolCallAssembler(max_calls=2, max_chars=10)
    for index in range(5):
        calls.feed(pieces(tool(index, id=str(index), name="f", arguments="")))
    for _ in range(100):
        calls.feed(pieces(tool(0, arguments="xxxx")))
    assert len(calls.calls()) == 2
    assert calls.skipped == 3
    assert 10 < len(calls.calls()[0].arguments) <= 15  # past the limit: refused later as oversized


def sse(*chunks: dict) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


async def test_stream_round_yields_text_then_the_calls_and_sends_the_tools():
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        body = sse(
            text("好的"), tool(0, id="c", name="f", arguments='{"a"'), tool(0, arguments=": 1}"), finish()
        )
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    llm = OpenAIChatLLM(base_url="http://llm.test", api_key=None, model="m", client=client)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    items = [item async for item in llm.stream_round([{"role": "user", "content": "hi"}], tools)]
    assert items == ["好的", [ToolCall("c", "f", '{"a": 1}')]]
    assert seen[0]["tools"] == tools and seen[0]["tool_choice"] == "auto"


async def test_a_whole_completion_with_tool_calls_is_understood():
    completion = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
                    ],
                }
            }
        ]
    }
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200, json=completion)))
    llm = OpenAIChatLLM(base_url="http://llm.test", api_key=None, model="m", client=client)
    items = [item async for item in llm.stream_round([{"role": "user", "content": "hi"}], [])]
    assert items == [[ToolCall("a", "f", "{}"), ToolCall("b", "g", "{}")]]


async def test_a_server_that_rejects_tools_is_asked_again_without_them():
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if "tools" in body:
            return httpx.Response(
                400, json={"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}}
            )
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=sse(text("hello"), finish())
        )

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    llm = OpenAIChatLLM(base_url="http://llm.test", api_key=None, model="m", client=client)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "hi"}]
    assert [item async for item in llm.stream_round(messages, tools)] == ["hello"]
    assert [item async for item in llm.stream_round(messages, tools)] == ["hello"]
    assert ["tools" in body for body in seen] == [True, False, False]  # not offered again
