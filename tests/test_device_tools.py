"""Loopback: the LLM (a scripted OpenAI-compatible server, real HTTP + SSE) calls tools.

The gateway runs in uvicorn, the device is the simulator with the firmware's MCP tools, and the
LLM's streamed `tool_calls` arrive split across chunks. Each test checks what the device got and
what the LLM was sent back.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from gateway.xiaozhi import AudioOut, TtsStart, TtsStop
from scripts.device_sim import FIRMWARE_TOOLS, DeviceSimulator
from tests.gateway_server import running_gateway
from tests.scripted_llm import Status, answer, call, scripted_llm, text, tool
from tts_engine.backends.fake import FakeBackend

SET_VOLUME = "self_audio_speaker_set_volume"  # the device's self.audio_speaker.set_volume, OpenAI-safe


class RecordingBackend(FakeBackend):
    """Short tones; remembers the voice of every sentence."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(chunk_ms=60, ms_per_char=15, **kw)
        self.spoken: list[tuple[str, str]] = []

    def open_stream(self, text: str, voice: str, speed: float):  # type: ignore[override]
        self.spoken.append((text, voice))
        return super().open_stream(text, voice, speed)


def config(llm_url: str, **llm: Any) -> dict[str, Any]:
    return {
        "llm": {"provider": "openai", "base_url": llm_url, "api_key": "", "model": "m", **llm},
        "session": {"enable_greeting": False},
    }


def tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def device(gw: Any) -> DeviceSimulator:
    sim = DeviceSimulator(gw.url, mcp_tools=FIRMWARE_TOOLS)
    await sim.connect()
    await sim.listen_start("auto")
    return sim


async def tool_call_counts(gw: Any) -> dict[tuple[str, str], float]:
    """``xz_tool_calls_total`` from the gateway's /metrics, by (source, outcome)."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{gw.url}/metrics")).text
    counts = {}
    for line in text.splitlines():
        if line.startswith("xz_tool_calls_total{"):
            labels, value = line[len("xz_tool_calls_total{") :].rsplit("} ", 1)
            pairs = dict(part.split("=", 1) for part in labels.split(","))
            counts[(pairs["source"].strip('"'), pairs["outcome"].strip('"'))] = float(value)
    return counts


def assert_clean_turn(turn: Any) -> None:
    kinds = [type(e) for e in turn.events if not isinstance(e, AudioOut)]
    assert kinds.count(TtsStart) == 1 and kinds[-1] is TtsStop


async def test_set_volume_through_the_device_mcp_tool():
    async with scripted_llm(call(SET_VOLUME, '{"volume": 50}'), answer("好的，音量调到五十了。")) as llm:
        async with running_gateway(config(llm.base_url), backend=RecordingBackend()) as gw:
            sim = await device(gw)
            turn = await sim.ask("把音量调到50")
            await sim.close()
            counts = await tool_call_counts(gw)

    assert counts == {("device", "ok"): 1}
    assert sim.mcp.calls == [("self.audio_speaker.set_volume", {"volume": 50})]
    assert sim.mcp.volume == 50
    first, second = llm.requests
    offered = {t["function"]["name"] for t in first["tools"]}
    assert {SET_VOLUME, "self_get_device_status", "end_conversation", "get_time"} <= offered
    asked = second["messages"][-2]
    assert asked["role"] == "assistant"
    assert asked["tool_calls"][0]["function"] == {"name": SET_VOLUME, "arguments": '{"volume": 50}'}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "true"}
    assert "".join(turn.sentences) == "好的，音量调到五十了。"
    assert turn.frames
    assert_clean_turn(turn)


async def test_a_tool_that_times_out_gets_a_filler_and_the_turn_goes_on():
    scripts = [call(SET_VOLUME, '{"volume": 30}'), answer("抱歉，音量没有调成功。")]
    async with scripted_llm(*scripts) as llm:
        cfg = config(llm.base_url, tool_timeout_s=0.6, tool_filler_after_s=0.2, tool_filler="稍等一下。")
        async with running_gateway(cfg, backend=RecordingBackend()) as gw:
            sim = await device(gw)

            async def hangs(_arguments: dict[str, Any]) -> Any:
                await asyncio.sleep(30)

            sim.mcp.handlers["self.audio_speaker.set_volume"] = hangs
            turn = await sim.ask("把音量调到30")
            again = await sim.ask("你好")  # the scripted server's default answer: "OK."
            await sim.close()
            counts = await tool_call_counts(gw)

    assert counts == {("device", "timeout"): 1}
    assert turn.sentences == ["稍等一下。", "抱歉，音量没有调成功。"]
    [result] = tool_results(llm.requests[1])
    assert result.startswith("Error") and "0.6 s" in result
    assert_clean_turn(turn)
    assert again.sentences == ["OK."]
    assert_clean_turn(again)


async def test_a_failing_tool_tells_the_llm_why():
    scripts = [call(SET_VOLUME, '{"volume": 500}'), answer("抱歉，音量只能在零到一百之间。")]
    async with scripted_llm(*scripts) as llm:
        async with running_gateway(config(llm.base_url), backend=RecordingBackend()) as gw:
            sim = await device(gw)
            turn = await sim.ask("把音量调到500")
            await sim.close()
            counts = await tool_call_counts(gw)

    assert counts == {("device", "failed"): 1}
    assert sim.mcp.volume == 70  # unchanged: the device refused
    [result] = tool_results(llm.requests[1])
    assert result.startswith("Error") and "Invalid volume" in result
    assert "".join(turn.sentences) == "抱歉，音量只能在零到一百之间。"
    assert_clean_turn(turn)


async def test_bad_arguments_and_an_unknown_tool_are_reported_to_the_llm():
    two_calls = [
        tool(0, id="a", name=SET_VOLUME, arguments='{"volume": 4'),  # cut off: not JSON
        tool(1, id="b", name="no_such_tool", arguments="{}"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    async with scripted_llm(two_calls, answer("抱歉，出了点问题。")) as llm:
        async with running_gateway(config(llm.base_url), backend=RecordingBackend()) as gw:
            sim = await device(gw)
            turn = await sim.ask("把音量调到40")
            await sim.close()

    assert sim.mcp.calls == []
    bad_json, unknown = tool_results(llm.requests[1])
    assert "not valid JSON" in bad_json
    assert "no such tool" in unknown
    assert_clean_turn(turn)


async def test_the_llm_failing_after_a_tool_call_is_apologised_for():
    async with scripted_llm(call(SET_VOLUME, '{"volume": 20}'), Status(500)) as llm:
        async with running_gateway(
            config(llm.base_url, apology="抱歉，我出错了。"), backend=RecordingBackend()
        ) as gw:
            sim = await device(gw)
            turn = await sim.ask("把音量调到20")
            await sim.close()

    assert sim.mcp.volume == 20
    assert turn.sentences == ["抱歉，我出错了。"]
    assert_clean_turn(turn)


async def test_abort_during_a_tool_call_cancels_it_and_the_session_goes_on():
    async with scripted_llm(call(SET_VOLUME, '{"volume": 10}')) as llm:
        async with running_gateway(
            config(llm.base_url, tool_filler_after_s=20), backend=RecordingBackend()
        ) as gw:
            sim = await device(gw)
            called = asyncio.Event()

            async def hangs(_arguments: dict[str, Any]) -> Any:
                called.set()
                await asyncio.sleep(30)

            sim.mcp.handlers["self.audio_speaker.set_volume"] = hangs
            t_query = await sim.detect("把音量调到10")
            await asyncio.wait_for(called.wait(), 10)
            t_abort = await sim.abort()
            turn = await sim.collect_turn(t_query, timeout=5)
            stopped = turn.time_of(TtsStop)
            requests_after_abort = len(llm.requests)
            session = gw.services.sessions[sim.device_id]
            pending_after_abort = session.mcp.pending_requests
            again = await sim.ask("你好")
            await sim.close()

    assert stopped is not None and stopped - t_abort < 2.0  # generous: the stop follows the abort
    assert pending_after_abort == 0  # the device call was cancelled with the turn
    assert requests_after_abort == 1  # ... and its result never went to the LLM
    assert_clean_turn(turn)
    assert again.sentences == ["OK."]


async def test_end_conversation_closes_the_session_after_the_goodbye():
    async with scripted_llm(call("end_conversation", "{}"), answer("好的，再见！")) as llm:
        async with running_gateway(config(llm.base_url), backend=RecordingBackend()) as gw:
            sim = await device(gw)
            turn = await sim.ask("我要走了，拜拜")
            await asyncio.wait_for(sim.closed.wait(), 10)
            closed_at = time.monotonic()
            await sim.close()

    assert "".join(turn.sentences) == "好的，再见！"
    assert turn.frames  # the goodbye was spoken before the socket closed
    assert_clean_turn(turn)
    assert closed_at >= turn.time_of(TtsStop)


async def test_change_voice_applies_to_the_rest_of_the_reply():
    backend = RecordingBackend(voices=("default", "alt"))
    first_round = [text("好的。"), *call("change_voice", '{"voice": "alt"}')]
    async with scripted_llm(first_round, answer("现在换成新声音了。")) as llm:
        async with running_gateway(config(llm.base_url), backend=backend) as gw:
            del backend.spoken[:]  # the fixed phrases, made at start-up
            sim = await device(gw)
            await sim.ask("换个声音")
            await sim.close()

    assert backend.spoken == [("好的。", "default"), ("现在换成新声音了。", "alt")]
    voice_tool = next(t for t in llm.requests[0]["tools"] if t["function"]["name"] == "change_voice")
    assert voice_tool["function"]["parameters"]["properties"]["voice"]["enum"] == ["default", "alt"]
