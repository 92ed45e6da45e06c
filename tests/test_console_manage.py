"""The console's management panels (devices, activation, agents) in headless Chromium against a real
gateway on loopback with `ota.activation: code` and an admin key.

A simulated device (scripts/device_sim.py, the firmware's OTA body and socket) gets a code, says it when
spoken to; the test types the code it heard into the Activation panel with an agent created in the
Agents panel, the device completes its activation as the firmware does (`POST /xiaozhi/ota/activate`),
talks with the agent's voice, then the agent's voice is changed in the page and the device's next turn
(same connection) uses it. Then xiaozhi-sdk (a third-party client, tests/test_activation_sdk.py) is bound
through the page by the code it was told, activates by its own polling, and talks with the agent. The
fake backend records each sentence's voice.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from scripts.device_sim import DeviceSimulator
from tests.console_browser import chromium_page, require_browser, screenshot
from tests.gateway_server import running_gateway
from tests.test_activation_sdk import ActivatingSdk
from tests.test_agents import InstructBackend

ADMIN = "admin-key-console-1"
CONFIG = {
    "ota": {"activation": "code"},
    "api": {"api_keys": [ADMIN]},
    "session": {"enable_greeting": False},
}


@pytest.fixture(autouse=True)
def _browser() -> None:
    require_browser()


async def wait_text(page, selector: str, text: str, timeout: int = 10000) -> None:
    await page.wait_for_function(
        "([s, t]) => { const e = document.querySelector(s); return e && e.textContent.includes(t); }",
        arg=[selector, text], timeout=timeout,
    )  # fmt: skip


async def settled(page) -> None:
    await page.wait_for_function("window.xzManage && window.xzManage.busy === 0", timeout=10000)


async def test_bind_a_device_by_its_spoken_code_and_change_its_agents_voice_in_the_console() -> None:
    backend = InstructBackend()
    async with running_gateway(CONFIG, backend=backend) as gw, chromium_page() as page:
        sim = DeviceSimulator(gw.url)
        shown = (await sim.ota())["activation"]["code"]
        await sim.connect()
        await sim.listen_start("auto")
        spoken = "".join((await sim.ask("你好")).sentences)
        code = "".join(re.findall(r"[0-9]", spoken))
        assert code == shown  # the device says the code it shows

        await page.goto(gw.url + "/console")
        await settled(page)
        assert "API key" in await page.inner_text("#agents-error")  # no admin key yet: a clear refusal
        await page.fill("#api-key", ADMIN)
        await page.click("#key-form button[type=submit]")
        await page.wait_for_function("window.xzManage.defaultAgent !== null", timeout=10000)
        await settled(page)
        rows = await page.inner_text("#devices-table")
        assert sim.device_id in rows and "code shown" in rows

        # a new agent, in the Agents panel
        await page.click("#agent-new")
        await page.fill("#agent-name", "kid")
        await page.fill("#agent-role", "你是小兔子。")
        await page.select_option("#agent-voice", "cartoon")
        await page.select_option("#agent-provider", "echo")
        await page.click("#agent-save")
        await wait_text(page, "#agent-state", "saved kid (version 1)")
        await settled(page)

        # the code the device said, typed as heard (digit by digit), bound to that agent
        await page.fill("#activation-code", " ".join(code))
        await page.select_option("#activation-agent", "kid")
        await page.click("#activation-bind")
        await wait_text(page, "#activation-result", f"bound {sim.device_id} to agent kid")
        await settled(page)
        async with httpx.AsyncClient(timeout=10) as client:  # the firmware's next /activate poll
            done = await client.post(f"{gw.url}/xiaozhi/ota/activate", json={},
                                     headers={"Device-Id": sim.device_id, "Client-Id": sim.client_id})  # fmt: skip
        assert done.status_code == 200, done.text
        await page.click("#devices-refresh")
        await settled(page)
        row = f"#devices-table tr[data-device-id='{sim.device_id}']"
        assert await page.input_value(f"{row} select") == "kid"
        assert await page.inner_text(f"{row} .online") == "online"

        turn = await sim.ask("讲个故事")
        assert any("讲个故事" in s for s in turn.sentences)  # the agent's (echo) LLM, not the code
        assert backend.spoken[-1][1] == "cartoon"

        # the agent's voice changed in the page: the device's next turn, same connection
        await page.select_option("#agent-voice", "calm")
        await page.click("#agent-save")
        await wait_text(page, "#agent-state", "saved kid (version 2)")
        turn = await sim.ask("再讲一个")
        assert any("再讲一个" in s for s in turn.sentences)
        assert backend.spoken[-1][1] == "calm"
        assert not sim.closed.is_set()

        # try the voice with a sentence
        await page.fill("#agent-try-text", "试试这个声音")
        await page.click("#agent-try")
        await page.wait_for_function("window.xzManage.tried !== null", timeout=15000)
        tried = await page.evaluate("window.xzManage.tried")
        assert tried["voice"] == "calm" and tried["bytes"] > 0
        assert ("试试这个声音", "calm") in {(t, v) for t, v, _, _ in backend.spoken}

        # xiaozhi-sdk, a third-party client, bound through the page by the code it was told to say
        sdk = ActivatingSdk(gw.url, "02:00:00:00:5d:28")
        try:
            sdk_code = await sdk.code()
            await page.fill("#activation-code", sdk_code)
            await page.select_option("#activation-agent", "kid")
            await page.click("#activation-bind")
            await wait_text(page, "#activation-result", "bound 02:00:00:00:5d:28 to agent kid")
            await sdk.activated("hi")  # its "hi" after the reconnect, echoed by the agent's LLM
        finally:
            await sdk.client.close()
        assert ("hi", "calm") in {(t, v) for t, v, _, _ in backend.spoken}

        await screenshot(page, "console-manage.png")
        await page.click(f"{row} .device-kick")  # kick: the session closes
        await asyncio.wait_for(sim.closed.wait(), 10)
        await sim.close()
        errors = page.errors
    assert errors == []
