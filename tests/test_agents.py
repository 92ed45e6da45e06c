"""Agents through a real loopback gateway: devices bound to agents talk with their agent's prompt, voice,
speed, instruct, LLM and tools (a scripted OpenAI-compatible server), at the same time; an edit applies
from the device's next turn without a reconnect; expressive speech maps the reply's emotion to an
instruct text; LLM keys are never shown back in full; bad input is a clear 4xx."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx

from scripts.device_sim import FIRMWARE_TOOLS, DeviceSimulator
from tests.gateway_server import RunningGateway, running_gateway
from tests.scripted_llm import ScriptedLLM, answer, scripted_llm
from tts_engine.backends.fake import FakeBackend, FakeStream

SECRET = "sk-test-0123456789abcdefWXYZ"
DEMO_SERVER = Path(__file__).parent / "mcp_servers" / "demo_server.py"


class InstructBackend(FakeBackend):
    """Short tones; takes instruct texts and remembers (text, voice, speed, instruct) of every sentence."""

    supports_instruct = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(chunk_ms=60, ms_per_char=10, voices=("default", "cartoon", "chef", "calm"), **kw)
        self.spoken: list[tuple[str, str, float, str | None]] = []

    def open_stream(self, text: str, voice: str, speed: float, instruct: str | None = None) -> FakeStream:
        self.spoken.append((text, voice, speed, instruct))
        return super().open_stream(text, voice, speed)

    def heard(self, text: str) -> tuple[str, float, str | None]:
        """The voice, speed and instruct of the last sentence ``text``."""
        return next((v, s, i) for t, v, s, i in reversed(self.spoken) if t == text)


def config(llm: ScriptedLLM) -> dict[str, Any]:
    return {
        "llm": {"provider": "openai", "base_url": llm.base_url, "api_key": "", "model": "default-model"},
        "session": {"enable_greeting": False},
    }


async def api(gw: RunningGateway, method: str, path: str, body: Any = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.request(method, f"{gw.url}{path}", json=body)


async def new_agent(gw: RunningGateway, **fields: Any) -> dict[str, Any]:
    reply = await api(gw, "POST", "/v1/agents", fields)
    assert reply.status_code == 201, reply.text
    return reply.json()


async def bound_device(gw: RunningGateway, agent: str, **kw: Any) -> DeviceSimulator:
    sim = DeviceSimulator(gw.url, **kw)
    await sim.ota()  # recorded by its OTA check (ota.activation: off)
    await gw.call(gw.services.devices.settle())
    reply = await api(gw, "PATCH", f"/v1/devices/{sim.device_id}", {"agent": agent})
    assert reply.status_code == 200 and reply.json()["agent"] == agent, reply.text
    await sim.connect()
    await sim.listen_start("auto")
    return sim


def request_of(llm: ScriptedLLM, model: str) -> dict[str, Any]:
    return next(r for r in reversed(llm.requests) if r["model"] == model)


def system_of(request: dict[str, Any]) -> str:
    return next(m["content"] for m in request["messages"] if m["role"] == "system")


def tool_names(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools", ())}


async def test_two_devices_talk_at_once_each_with_its_agents_prompt_voice_llm_and_tools() -> None:
    backend = InstructBackend()
    async with scripted_llm() as llm, running_gateway(config(llm), backend=backend) as gw:
        await new_agent(gw, name="kid", role_prompt="你是小兔子。", voice="cartoon", speed=1.25,
                        llm={"provider": "openai", "base_url": llm.base_url, "model": "kid-model",
                             "temperature": 0.9},
                        tools={"device": False, "builtins": ["get_time"]})  # fmt: skip
        await new_agent(gw, name="kitchen", role_prompt="你是厨房助手。", voice="chef", instruct="用平静的语气说",
                        llm={"provider": "openai", "base_url": llm.base_url, "model": "chef-model"},
                        tools={"device": True, "builtins": []})  # fmt: skip
        kid = await bound_device(gw, "kid", mcp_tools=FIRMWARE_TOOLS)
        chef = await bound_device(gw, "kitchen", mcp_tools=FIRMWARE_TOOLS)
        llm.scripts[:] = [answer("好的。"), answer("好的。")]
        kid_turn, chef_turn = await asyncio.gather(kid.ask("讲个故事"), chef.ask("煮饭要多久"))
        assert kid_turn.frames and chef_turn.frames

        kid_req, chef_req = request_of(llm, "kid-model"), request_of(llm, "chef-model")
        assert system_of(kid_req) == "你是小兔子。" and system_of(chef_req) == "你是厨房助手。"
        assert kid_req["temperature"] == 0.9 and "temperature" not in chef_req
        assert tool_names(kid_req) == {"get_time"}  # no device tools, one built-in
        chef_tools = tool_names(chef_req)
        assert chef_tools and not chef_tools & {"get_time", "change_voice", "end_conversation"}
        voices = {v for _, v, _, _ in backend.spoken}
        assert {"cartoon", "chef"} <= voices
        assert {(v, s, i) for _, v, s, i in backend.spoken if v in ("cartoon", "chef")} == {
            ("cartoon", 1.25, None), ("chef", 1.0, "用平静的语气说")
        }  # fmt: skip

        # an edit applies from the device's next turn, no reconnect; the other device is untouched
        kid_version = (await api(gw, "GET", "/v1/agents/kid")).json()["version"]
        edit = await api(gw, "PATCH", "/v1/agents/kid",
                         {"version": kid_version, "voice": "calm", "role_prompt": "你是小熊。"})  # fmt: skip
        assert edit.status_code == 200 and edit.json()["version"] == kid_version + 1, edit.text
        stale = await api(gw, "PATCH", "/v1/agents/kid", {"version": kid_version, "speed": 1.0})
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "version_conflict"
        llm.scripts[:] = [answer("再讲一个。"), answer("二十分钟。")]  # one at a time: scripts go in order
        await kid.ask("再讲一个")
        await chef.ask("还要多久")
        assert backend.heard("再讲一个。") == ("calm", 1.25, None)
        assert backend.heard("二十分钟。") == ("chef", 1.0, "用平静的语气说")
        assert system_of(request_of(llm, "kid-model")) == "你是小熊。"

        # a device moved to another agent, and an agent deleted: from the next turn
        assert (await api(gw, "PATCH", f"/v1/devices/{chef.device_id}", {"agent": "kid"})).status_code == 200
        llm.scripts[:] = [answer("换了。")]
        await chef.ask("你是谁")
        assert backend.heard("换了。") == ("calm", 1.25, None)
        assert (await api(gw, "DELETE", "/v1/agents/kid")).status_code == 204
        llm.scripts[:] = [answer("默认。")]
        await kid.ask("你是谁")
        assert llm.requests[-1]["model"] == "default-model"
        assert backend.heard("默认。")[0] == "default"
        assert kid.server_hello is not None and not kid.closed.is_set()  # the same connection throughout
        await kid.close()
        await chef.close()


async def test_expressive_speech_turns_the_replys_emotion_into_its_instruct_text() -> None:
    backend = InstructBackend()
    async with scripted_llm() as llm, running_gateway(config(llm), backend=backend) as gw:
        await new_agent(gw, name="lively", expressive=True, instruct="慢慢说",
                        llm={"provider": "openai", "base_url": llm.base_url, "model": "m"})  # fmt: skip
        await new_agent(gw, name="flat", llm={"provider": "openai", "base_url": llm.base_url, "model": "m"})
        lively = await bound_device(gw, "lively")
        llm.scripts[:] = [answer("🙂太好了！"), answer("😔真遗憾。"), answer("😶我是机器人。")]
        happy = await lively.ask("我考了满分")
        await lively.ask("我的鱼死了")
        await lively.ask("你是谁")
        assert happy.emotions and happy.emotions[0] == "happy"  # the face, as before
        table = gw.services.config.agents.expressive_instructs
        assert backend.heard("太好了！")[2] == table["happy"]
        assert backend.heard("真遗憾。")[2] == table["sad"]
        assert backend.heard("我是机器人。")[2] == "慢慢说"  # neutral, not in the table: the agent's own
        await lively.close()

        flat = await bound_device(gw, "flat")  # off by default
        llm.scripts[:] = [answer("🙂好呀。")]
        await flat.ask("你好")
        assert backend.heard("好呀。")[2] is None
        await flat.close()


async def test_llm_keys_are_masked_and_kept_when_sent_back() -> None:
    async with scripted_llm() as llm, running_gateway(config(llm), backend=InstructBackend()) as gw:
        created = await new_agent(gw, name="keyed", llm={"provider": "openai", "base_url": llm.base_url,
                                                         "model": "m", "api_key": SECRET})  # fmt: skip
        assert created["llm"]["api_key"] == "****WXYZ"
        listed = (await api(gw, "GET", "/v1/agents")).text
        assert SECRET not in listed and SECRET not in (await api(gw, "GET", "/v1/agents/keyed")).text
        # the masked key sent back unchanged keeps the key; a new one replaces it
        shown = (await api(gw, "GET", "/v1/agents/keyed")).json()
        again = await api(gw, "PATCH", "/v1/agents/keyed", {"llm": shown["llm"], "temperature_unused": None})
        assert again.status_code == 400  # an unknown field is refused, naming it
        again = await api(gw, "PATCH", "/v1/agents/keyed", {"llm": shown["llm"], "greeting": "嗨"})
        assert again.status_code == 200 and again.json()["llm"]["api_key"] == "****WXYZ"
        stored = await gw.call(gw.services.agents.store.get("keyed"))
        assert stored is not None and stored.profile.llm.api_key == SECRET
        assert SECRET not in repr(stored.profile)


async def test_bad_agents_are_refused_with_the_field_at_fault() -> None:
    async with running_gateway({"session": {"enable_greeting": False}}, backend=InstructBackend()) as gw:
        cases = [
            ({"name": "Bad Name"}, "name"),
            ({"name": "a", "voice": "nobody"}, "voice"),
            ({"name": "a", "speed": 9}, "speed"),
            ({"name": "a", "llm": {"base_url": "ftp://x"}}, "llm.base_url"),
            ({"name": "a", "tools": {"builtins": ["rm_rf"]}}, "tools.builtins"),
            ({"name": "a", "tools": {"mcp_servers": ["nowhere"]}}, "tools.mcp_servers"),
            ({"name": "a", "role_prompt": "x" * 8001}, "role_prompt"),
        ]
        for body, field in cases:
            reply = await api(gw, "POST", "/v1/agents", body)
            assert reply.status_code == 400, (body, reply.text)
            assert field in (reply.json()["error"].get("param") or "") + reply.json()["error"]["message"]
        assert (await api(gw, "POST", "/v1/agents", ["not", "an", "object"])).status_code == 400
        assert (await api(gw, "POST", "/v1/agents", {"name": "default"})).status_code == 409
        assert (await api(gw, "PATCH", "/v1/agents/default", {"speed": 1.1})).status_code == 409
        assert (await api(gw, "GET", "/v1/agents/ghost")).status_code == 404
        await new_agent(gw, name="one")
        assert (await api(gw, "POST", "/v1/agents", {"name": "one"})).status_code == 409
        assert (await api(gw, "PATCH", "/v1/devices/nobody", {"agent": "one"})).status_code == 404
        default = (await api(gw, "GET", "/v1/agents")).json()["default"]
        assert default["name"] == "default" and default["read_only"] is True


async def test_the_management_api_needs_an_admin_key() -> None:
    async with running_gateway({"api": {"api_keys": ["admin-key-1"]}}, backend=InstructBackend()) as gw:
        async with httpx.AsyncClient(timeout=10) as client:
            for method, path in (("GET", "/v1/agents"), ("GET", "/v1/devices"), ("POST", "/v1/activations")):
                assert (await client.request(method, f"{gw.url}{path}", json={})).status_code == 401
            ok = await client.get(f"{gw.url}/v1/agents", headers={"Authorization": "Bearer admin-key-1"})
        assert ok.status_code == 200


async def test_an_agents_memory_and_idle_timeouts_apply_to_its_devices() -> None:
    async with scripted_llm() as llm, running_gateway(config(llm), backend=InstructBackend()) as gw:
        model = {"provider": "openai", "base_url": llm.base_url, "model": "m"}
        await new_agent(gw, name="remembers", memory=True, llm=model)  # session.memory is none
        await new_agent(gw, name="forgets", llm=model, idle_no_voice_s=1.0, idle_hard_s=1.5)
        keeper = await bound_device(gw, "remembers", device_id="02:00:00:00:a1:01")
        await keeper.ask("我叫小明")
        await keeper.close()
        await gw.call(gw.services.memory.settle())  # the exchange is written
        again = await bound_device(gw, "remembers", device_id="02:00:00:00:a1:01")
        await again.ask("我叫什么？")
        await again.close()
        assert any("我叫小明" in str(m["content"]) for m in llm.requests[-1]["messages"][:-1])

        sleeper = await bound_device(gw, "forgets", device_id="02:00:00:00:a1:02")
        await sleeper.ask("你好")  # the agent (and its idle timeouts) is read at hello and at each turn
        await asyncio.wait_for(sleeper.closed.wait(), 10)  # the default agent would wait 120 s
        await sleeper.close()
        other = await bound_device(gw, "forgets", device_id="02:00:00:00:a1:03")
        await other.ask("我叫小红")
        await other.close()
        await gw.call(gw.services.memory.settle())
        third = await bound_device(gw, "forgets", device_id="02:00:00:00:a1:03")
        await third.ask("我叫什么？")
        await third.close()
        assert not any("我叫小红" in str(m["content"]) for m in llm.requests[-1]["messages"][:-1])


async def test_each_agent_is_offered_only_the_server_mcp_tools_it_may_call() -> None:
    async with scripted_llm() as llm:
        cfg = {**config(llm), "tools": {"mcp_servers": {"demo": {"command": sys.executable,
                                                                 "args": [str(DEMO_SERVER)]}}}}  # fmt: skip
        async with running_gateway(cfg, backend=InstructBackend()) as gw:
            model = {"provider": "openai", "base_url": llm.base_url}
            await new_agent(gw, name="weather", llm={**model, "model": "weather-model"},
                            tools={"mcp_servers": ["demo"], "builtins": [], "device": False})  # fmt: skip
            await new_agent(gw, name="plain", llm={**model, "model": "plain-model"},
                            tools={"mcp_servers": [], "builtins": ["get_time"], "device": False})  # fmt: skip
            weather = await bound_device(gw, "weather")
            plain = await bound_device(gw, "plain")
            await asyncio.gather(weather.ask("天气"), plain.ask("几点"))
            await weather.close()
            await plain.close()
    assert "lookup_weather" in tool_names(request_of(llm, "weather-model"))
    assert "get_time" not in tool_names(request_of(llm, "weather-model"))
    assert tool_names(request_of(llm, "plain-model")) == {"get_time"}


async def test_the_wake_word_gets_the_agents_greeting_in_its_voice() -> None:
    backend = InstructBackend()
    async with scripted_llm() as llm:
        cfg = {**config(llm), "session": {"enable_greeting": True}}
        async with running_gateway(cfg, backend=backend) as gw:
            await new_agent(gw, name="bunny", greeting="嗨，我是小兔子！", voice="cartoon",
                            llm={"provider": "echo"})  # fmt: skip
            sim = await bound_device(gw, "bunny")
            turn = await sim.ask("你好小智")
            await sim.close()
            plain = DeviceSimulator(gw.url)  # no agent: the config's greeting, as before
            await plain.connect()
            await plain.listen_start("auto")
            default_turn = await plain.ask("你好小智")
            await plain.close()
    assert turn.sentences == ["嗨，我是小兔子！"] and backend.heard("嗨，我是小兔子！")[0] == "cartoon"
    assert default_turn.sentences == [gw.services.config.session.greeting]
    assert not llm.requests
