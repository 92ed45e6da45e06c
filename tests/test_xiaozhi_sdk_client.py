"""xiaozhi-sdk (PyPI), a third-party device client, against our loopback gateway: it finds the WebSocket
through our OTA endpoint, connects, registers one MCP tool, and our server lists that tool.

scripts/setup.sh installs xiaozhi-sdk with --no-deps and the few packages its client core imports
(the `test` extra): its CLI's audio devices (sounddevice/PortAudio) are never imported here."""

from __future__ import annotations

import asyncio
import ctypes.util
from typing import Any

import pytest

from gateway.tools.base import ToolSpec
from tests.gateway_server import running_gateway
from tests.scripted_llm import answer, call, scripted_llm
from tts_engine.backends.fake import FakeBackend

_find_library = ctypes.util.find_library
from xiaozhi_sdk import XiaoZhiWebsocket  # noqa: E402 - its import patches ctypes.util.find_library

# The SDK makes find_library("opus") answer its bundled libopus for every later import in the process;
# give the process its own lookup back (the SDK's opuslib has already loaded its library).
ctypes.util.find_library = _find_library

DEVICE_MAC = "02:00:00:00:5d:01"
VOLUME_TOOL: dict[str, Any] = {
    "name": "self.audio_speaker.set_volume",
    "description": "Set the volume of the device's speaker (0-100).",
    "inputSchema": {
        "type": "object",
        "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["volume"],
    },
}


class SdkDevice:
    """A xiaozhi-sdk client with the volume tool; records the tool calls and the messages it gets."""

    def __init__(self, ota_url: str) -> None:
        self.calls: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.reply_done = asyncio.Event()  # `tts stop` arrived
        self.client = XiaoZhiWebsocket(self._on_message, ota_url=ota_url, audio_sample_rate=16000)

    async def _on_message(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if message.get("type") == "tts" and message.get("state") == "stop":
            self.reply_done.set()

    async def connect(self) -> None:
        calls = self.calls

        def set_volume(arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
            calls.append(arguments)
            return {"volume": arguments.get("volume")}, False

        # a plain function: the SDK deep-copies its tool table (a bound method would copy the client)
        await self.client.set_mcp_tool([{**VOLUME_TOOL, "tool_func": set_volume}])
        assert await self.client.init_connection(DEVICE_MAC)


@pytest.fixture
async def gateway():
    async with running_gateway(backend=FakeBackend()) as gw:
        yield gw


async def test_the_sdk_connects_through_ota_and_its_tool_is_listed(gateway):
    device = SdkDevice(f"{gateway.url}/xiaozhi/ota/")
    try:
        await device.connect()
        assert device.client.session_id  # our hello reached it

        async def listed_tools() -> list[ToolSpec]:
            session = gateway.services.sessions[DEVICE_MAC]
            await session.mcp.started.wait()  # initialize and tools/list answered (or failed)
            return await session.mcp.list_tools()

        tools = await gateway.call(listed_tools())  # what a turn offers the LLM
        assert [tool.name for tool in tools] == [VOLUME_TOOL["name"]]
        assert tools[0].parameters["required"] == ["volume"]
        assert tools[0].description == VOLUME_TOOL["description"]
    finally:
        await device.client.close()


async def test_a_scripted_llm_calls_the_sdk_devices_tool():
    safe_name = "self_audio_speaker_set_volume"  # the OpenAI-safe name of self.audio_speaker.set_volume
    scripts = [call(safe_name, '{"volume": 50}'), answer("好的，音量调到五十了。")]
    async with scripted_llm(*scripts) as llm:
        overrides = {
            "llm": {"provider": "openai", "base_url": llm.base_url, "api_key": "", "model": "m"},
            "session": {"enable_greeting": False},
        }
        async with running_gateway(overrides, backend=FakeBackend()) as gw:
            device = SdkDevice(f"{gw.url}/xiaozhi/ota/")
            try:
                await device.connect()
                assert await device.client.send_text("把音量调到50")
                async with asyncio.timeout(30):
                    await device.reply_done.wait()
            finally:
                await device.client.close()

    assert device.calls == [{"volume": 50}]  # the SDK ran its tool with the LLM's arguments
    first, second = llm.requests
    offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert offered[safe_name]["description"] == VOLUME_TOOL["description"]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": '{"volume": 50}'}
    spoken = [
        m["text"] for m in device.messages if m.get("type") == "tts" and m.get("state") == "sentence_start"
    ]
    assert "".join(spoken) == "好的，音量调到五十了。"
