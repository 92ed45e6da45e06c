"""The camera's explain endpoint through a real loopback gateway: the device gets our URL and a vision
token in MCP `initialize`, posts a photo and a question as the firmware does (multipart, Bearer token,
Device-Id), the agent's vision model (a scripted OpenAI-compatible server) gets the image as a data
URL, and the device gets the answer in the firmware's shape; bad input is a clear 4xx; off without a
vision model."""

from __future__ import annotations

import base64
from typing import Any

import httpx

from scripts.device_sim import DeviceSimulator
from tests.gateway_server import RunningGateway, running_gateway
from tests.scripted_llm import ScriptedLLM, answer, scripted_llm
from tests.test_session_idle import wait_for_initialize
from tts_engine.backends.fake import FakeBackend

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(200)
JPEG = b"\xff\xd8\xff\xe0" + bytes(300)


def config(llm: ScriptedLLM, **vision: Any) -> dict[str, Any]:
    return {
        "llm": {"provider": "openai", "base_url": llm.base_url, "api_key": "", "model": "chat-model"},
        "session": {"enable_greeting": False},
        "vision": vision,
    }


async def capability(gw: RunningGateway, device_id: str) -> dict[str, str]:
    sim = DeviceSimulator(gw.url, device_id=device_id, mcp_tools=[])
    await sim.connect()
    init = await wait_for_initialize(sim)
    await sim.close()
    return init["params"]["capabilities"]["vision"]


async def explain(url: str, device_id: str, token: str | None, image: bytes, question: str = "这是什么？",
                  name: str = "camera.jpg") -> httpx.Response:  # fmt: skip
    headers = {"Device-Id": device_id, "Client-Id": "c-1"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url, headers=headers, data={"question": question},
                                 files={"file": (name, image, "image/jpeg")})  # fmt: skip


async def test_a_photo_is_explained_by_the_vision_model_with_the_devices_token() -> None:
    async with scripted_llm() as llm, running_gateway(config(llm, model="vis-model", max_image_bytes=4096),
                                                      backend=FakeBackend()) as gw:  # fmt: skip
        device = "02:00:00:00:f1:01"
        vision = await capability(gw, device)
        assert vision["url"] == f"{gw.url}/mcp/vision/explain" and vision["token"]

        llm.scripts[:] = [answer("一只猫坐在桌子上。")]
        reply = await explain(vision["url"], device, vision["token"], PNG)
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"success": True, "action": "RESPONSE", "response": "一只猫坐在桌子上。"}
        request = llm.requests[-1]
        assert request["model"] == "vis-model"
        text_part, image_part = request["messages"][-1]["content"]
        assert text_part == {"type": "text", "text": "这是什么？"}
        assert image_part["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()

        # a JPEG sent as the firmware does it; the image type comes from its bytes, not its name
        llm.scripts[:] = [answer("一张照片。")]
        assert (await explain(vision["url"], device, vision["token"], JPEG, name="x.png")).status_code == 200
        assert llm.requests[-1]["messages"][-1]["content"][1]["image_url"]["url"].startswith("data:image/jpeg")

        asked = len(llm.requests)
        other = "02:00:00:00:f1:02"
        cases = [
            (await explain(vision["url"], device, None, PNG), 401),  # no token
            (await explain(vision["url"], other, vision["token"], PNG), 401),  # another device's token
            (await explain(vision["url"], device, "forged", PNG), 401),
            (await explain(vision["url"], device, vision["token"], b"GIF89a" + bytes(64)), 415),
            (await explain(vision["url"], device, vision["token"], b"not an image at all"), 415),
            (await explain(vision["url"], device, vision["token"], PNG, question="问" * 1001), 400),
            (await explain(vision["url"], device, vision["token"], PNG + bytes(5000)), 413),  # the route's cap
            (await explain(vision["url"], device, vision["token"], PNG + bytes(200_000)), 413),  # while it streams
        ]
        for reply, status in cases:
            assert reply.status_code == status, (status, reply.text)
            body = reply.json()  # the route's shape; the body cap's (http_guard) is the API's error shape
            assert (body["success"] is False and body["message"]) if "success" in body else body["error"]["message"]
        async with httpx.AsyncClient(timeout=10) as client:
            no_form = await client.post(vision["url"], content=b"{}", headers={
                "Device-Id": device, "Authorization": f"Bearer {vision['token']}",
                "Content-Type": "application/json"})  # fmt: skip
        assert no_form.status_code == 400
        assert len(llm.requests) == asked  # nothing bad reached the model


async def test_a_failing_vision_model_is_a_502_with_a_message() -> None:
    async with scripted_llm() as llm, running_gateway(config(llm, model="vis-model", timeout_s=5),
                                                      backend=FakeBackend()) as gw:  # fmt: skip
        device = "02:00:00:00:f1:03"
        vision = await capability(gw, device)
        llm.scripts[:] = [answer("")]
        reply = await explain(vision["url"], device, vision["token"], PNG)
        assert reply.status_code == 502 and reply.json()["success"] is False


async def test_an_agents_own_vision_model_and_vision_off_without_one() -> None:
    async with scripted_llm() as llm, running_gateway(config(llm), backend=FakeBackend()) as gw:
        plain = "02:00:00:00:f1:04"
        off = await capability(gw, plain)
        assert off == {"url": "", "token": ""}  # no vision model: devices are told no URL
        async with httpx.AsyncClient(timeout=10) as client:
            made = await client.post(f"{gw.url}/v1/agents", json={
                "name": "seer", "vision_model": "agent-vis",
                "llm": {"provider": "openai", "base_url": llm.base_url, "model": "chat-model"}})  # fmt: skip
            assert made.status_code == 201, made.text
            seer = "02:00:00:00:f1:05"
            await DeviceSimulator(gw.url, device_id=seer).ota()
            await gw.call(gw.services.devices.settle())
            assert (await client.patch(f"{gw.url}/v1/devices/{seer}", json={"agent": "seer"})).status_code == 200
        vision = await capability(gw, seer)
        assert vision["url"].endswith("/mcp/vision/explain") and vision["token"]
        llm.scripts[:] = [answer("我看到一本书。")]
        reply = await explain(vision["url"], seer, vision["token"], PNG)
        assert reply.status_code == 200 and reply.json()["response"] == "我看到一本书。"
        assert llm.requests[-1]["model"] == "agent-vis"
