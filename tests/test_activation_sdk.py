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
            messages: list[dict[str, Any]] = []

            async def on_message(message: dict[str, Any]) -> None:
                messages.append(message)

            sdk = XiaoZhiWebsocket(on_message, ota_url=f"{gw.url}/xiaozhi/ota/", audio_sample_rate=16000)
            try:
                assert await sdk.init_connection(DEVICE_MAC)  # OTA (with `activation`), socket, "hi"
                assert sdk.wait_device_activated and sdk.ota_task is not None  # it polls /activate
                async with asyncio.timeout(15):
                    while not re.search(r"([0-9] ){5}[0-9]", spoken(messages)):
                        await asyncio.sleep(0.05)
                code = "".join(re.findall(r"[0-9]", spoken(messages)))
                assert len(code) == 6 and not llm.requests  # the code, spoken; no LLM asked

                store_url = gw.services.config.store.url
                wrong = await asyncio.to_thread(cli, store_url, "devices", "bind", "000000"
                                                if code != "000000" else "111111", "--agent", "kid")  # fmt: skip
                assert wrong.returncode == 1 and "code" in wrong.stderr.lower()
                bound = await asyncio.to_thread(cli, store_url, "devices", "bind", code, "--agent", "kid")
                assert bound.returncode == 0, bound.stderr
                assert DEVICE_MAC in bound.stdout and "kid" in bound.stdout

                llm.scripts[:] = [answer("你好呀，我是小兔子。")]
                async with asyncio.timeout(40):  # the SDK polls every 3 s, then reconnects and says "hi"
                    await sdk.ota_task
                    while "我是小兔子" not in spoken(messages):
                        await asyncio.sleep(0.05)
            finally:
                await sdk.close()

            assert not sdk.wait_device_activated
            request = llm.requests[-1]
            assert request["model"] == "kid-model"
            assert request["messages"][0] == {"role": "system", "content": "你是小兔子。"}
            assert request["messages"][-1]["content"] == "hi"
            assert ("你好呀，我是小兔子。", "cartoon") in {(t, v) for t, v, _, _ in backend.spoken}
            listing = await asyncio.to_thread(cli, store_url, "devices", "list", "--json")
            assert listing.returncode == 0, listing.stderr
            assert '"kid"' in listing.stdout and DEVICE_MAC in listing.stdout
