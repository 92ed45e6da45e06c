"""xiaozhi-sdk (PyPI; its `OtaDevice` is the client side of activation) through our OTA with
`ota.activation: code`: it gets a code, connects and hears the code spoken, the operator binds that code
with the CLI (`python -m gateway devices bind CODE --agent NAME`, a separate process on the same store),
the SDK's own `/activate` polling sees 200, it reconnects and talks with its agent's prompt (a scripted
OpenAI-compatible LLM) and voice (the fake backend records it)."""

from __future__ import annotations

import asyncio
import ctypes.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.gateway_server import running_gateway
from tests.scripted_llm import answer, scripted_llm
from tests.test_agents import InstructBackend

_find_library = ctypes.util.find_library
from xiaozhi_sdk import XiaoZhiWebsocket  # noqa: E402 - its import patches ctypes.util.find_library

ctypes.util.find_library = _find_library  # as in tests/test_xiaozhi_sdk_client.py

ROOT = Path(__file__).resolve().parent.parent
DEVICE_MAC = "02:00:00:00:5d:27"


def spoken(messages: list[dict[str, Any]]) -> str:
    return "".join(m["text"] for m in messages if m.get("type") == "tts" and m.get("state") == "sentence_start")


def cli(store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XZ_STORE__URL": store_url, "XZ_OTA__ACTIVATION": "code"}
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


class ActivatingSdk:
    """A xiaozhi-sdk client that starts unactivated: it records what it is told and says."""

    def __init__(self, gateway_url: str, mac: str = DEVICE_MAC) -> None:
        self.mac = mac
        self.messages: list[dict[str, Any]] = []
        self.client = XiaoZhiWebsocket(self._on_message, ota_url=f"{gateway_url}/xiaozhi/ota/",
                                       audio_sample_rate=16000)  # fmt: skip

    async def _on_message(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def spoken(self) -> str:
        return spoken(self.messages)

    async def code(self) -> str:
        """Starts it (OTA with `activation`, the socket, "hi") and returns the code it is told to say."""
        assert await self.client.init_connection(self.mac)
        assert self.client.wait_device_activated and self.client.ota_task is not None  # it polls /activate
        async with asyncio.timeout(15):
            while not re.search(r"([0-9] ){5}[0-9]", self.spoken()):
                await asyncio.sleep(0.05)
        code = "".join(re.findall(r"[0-9]", self.spoken()))
        assert len(code) == 6
        return code

    async def activated(self, answer_part: str) -> None:
        """Waits for its own polling to see 200, its reconnect, and an answer holding `answer_part`."""
        assert self.client.ota_task is not None
        async with asyncio.timeout(90):  # the SDK polls every 3 s, then reconnects and says "hi" (a loaded CI)
            await self.client.ota_task
            while answer_part not in self.spoken():
                await asyncio.sleep(0.05)
        assert not self.client.wait_device_activated


async def test_the_sdk_activates_by_a_code_bound_with_the_cli_and_talks_with_its_agent() -> None:
    backend = InstructBackend()
    async with scripted_llm() as llm:
        cfg = {"ota": {"activation": "code"}, "session": {"enable_greeting": False},
               "llm": {"provider": "openai", "base_url": llm.base_url, "api_key": "", "model": "default-model"}}  # fmt: skip
        async with running_gateway(cfg, backend=backend) as gw:
            async with httpx.AsyncClient(timeout=10) as client:
                made = await client.post(f"{gw.url}/v1/agents", json={
                    "name": "kid", "role_prompt": "你是小兔子。", "voice": "cartoon",
                    "llm": {"provider": "openai", "base_url": llm.base_url, "model": "kid-model"}})  # fmt: skip
            assert made.status_code == 201, made.text
            sdk = ActivatingSdk(gw.url)
            try:
                code = await sdk.code()  # OTA (with `activation`), the socket, "hi": the code, spoken
                assert not llm.requests  # no LLM asked

                store_url = gw.services.config.store.url
                wrong = await asyncio.to_thread(cli, store_url, "devices", "bind", "000000"
                                                if code != "000000" else "111111", "--agent", "kid")  # fmt: skip
                assert wrong.returncode == 1 and "code" in wrong.stderr.lower()
                bound = await asyncio.to_thread(cli, store_url, "devices", "bind", code, "--agent", "kid")
                assert bound.returncode == 0, bound.stderr
                assert DEVICE_MAC in bound.stdout and "kid" in bound.stdout

                llm.scripts[:] = [answer("你好呀，我是小兔子。")]
                await sdk.activated("我是小兔子")
            finally:
                await sdk.client.close()

            request = llm.requests[-1]
            assert request["model"] == "kid-model"
            assert request["messages"][0] == {"role": "system", "content": "你是小兔子。"}
            assert request["messages"][-1]["content"] == "hi"
            assert ("你好呀，我是小兔子。", "cartoon") in {(t, v) for t, v, _, _ in backend.spoken}
            listing = await asyncio.to_thread(cli, store_url, "devices", "list", "--json")
            assert listing.returncode == 0, listing.stderr
            assert '"kid"' in listing.stdout and DEVICE_MAC in listing.stdout
