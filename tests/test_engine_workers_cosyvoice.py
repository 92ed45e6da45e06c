"""The tiny CosyVoice model in 2 engine workers: voices reach every worker, also one that restarts."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest

from gateway.llm.echo import EchoLLM
from scripts.device_sim import DeviceSimulator
from scripts.make_tiny_model import make_model_dir
from tests.gateway_server import RunningGateway, running_gateway
from tests.test_backend_cosyvoice import prompt_wav
from tts_engine.worker.frames import Health

RATE = 24000


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    model_dir = make_model_dir(tmp_path_factory.mktemp("cosyvoice") / "model", "tiny", seed=0)
    voices = tmp_path_factory.mktemp("voices")
    (voices / "default.wav").write_bytes(prompt_wav())
    (voices / "default.yaml").write_text("prompt_wav: default.wav\nprompt_text: 你好。\n", encoding="utf-8")
    return model_dir, voices


async def worker_voices(gw: RunningGateway) -> list[list[str]]:
    async def ask() -> list[list[str]]:
        links = [slot.link for slot in gw.services.engine.slots]  # type: ignore[union-attr]
        return [(await link.call(Health(call=0))).voices for link in links]

    return await gw.call(ask())


async def test_two_cosyvoice_workers_share_the_voice_set(dirs: tuple[Path, Path]) -> None:
    model_dir, voices = dirs
    overrides = {
        "tts": {"backend": "cosyvoice", "model_dir": str(model_dir), "voices_dir": str(voices), "device": "cpu",
                "text_normalization": "off", "cpu_threads": 1},
        "engine": {"workers": 2, "max_batch_size": 4, "max_llm_len": 256, "worker_start_timeout_s": 120,
                   "flow_cache": False},
        "audio": {"output_sample_rate": RATE},
    }  # fmt: skip
    llm = EchoLLM(prefix="", chinese_prefix="")
    async with running_gateway(overrides, llm=llm) as gw, httpx.AsyncClient(timeout=120) as client:
        health = (await client.get(f"{gw.url}/v1/health")).json()
        assert [w["state"] for w in health["engine"]["workers"]] == ["ready", "ready"]
        assert await worker_voices(gw) == [["default"], ["default"]]  # the preset reached both

        async def turn(index: int) -> list[str]:
            sim = DeviceSimulator(gw.url, device_id=f"aa:bb:cc:00:02:{index:02x}", protocol_version=1)
            await sim.connect()
            try:
                await sim.listen_start("auto")
                result = await sim.ask("好。", timeout=90)
                assert result.audio.size > 0
                return result.sentences
            finally:
                await sim.close()

        async with asyncio.timeout(120):
            assert await asyncio.gather(*(turn(i) for i in range(4))) == [["好。"]] * 4

        files = {"prompt_wav": ("bob.wav", prompt_wav(1.5), "audio/wav")}
        added = await client.post(
            f"{gw.url}/v1/voices", data={"name": "bob", "prompt_text": "你好。"}, files=files
        )
        assert added.status_code == 201, added.text
        assert [sorted(v) for v in await worker_voices(gw)] == [["bob", "default"]] * 2  # on both workers
        files = {"prompt_wav": ("eve.wav", prompt_wav(1.2), "audio/wav")}
        added = await client.post(
            f"{gw.url}/v1/voices", data={"name": "eve", "prompt_text": "你好。"}, files=files
        )
        assert added.status_code == 201, added.text
        assert (await client.delete(f"{gw.url}/v1/voices/eve")).status_code == 204
        assert [sorted(v) for v in await worker_voices(gw)] == [["bob", "default"]] * 2

        victim = gw.services.engine.slots[1]  # type: ignore[union-attr]
        os.kill(victim.process.pid, signal.SIGKILL)
        async with asyncio.timeout(120):
            while victim.restarts == 0 or victim.state != "ready":
                await asyncio.sleep(0.1)
        # the new worker got the voice set replayed: the start-up preset and the run-time one, not eve
        assert [sorted(v) for v in await worker_voices(gw)] == [["bob", "default"]] * 2
        reply = await client.post(f"{gw.url}/v1/tts", json={"text": "好。", "voice": "bob", "format": "pcm"})
        assert reply.status_code == 200 and len(reply.content) > 0


async def test_a_workers_flow_cache_and_steps_show_in_health_and_metrics(dirs: tuple[Path, Path]) -> None:
    model_dir, voices = dirs
    overrides = {
        "tts": {"backend": "cosyvoice", "model_dir": str(model_dir), "voices_dir": str(voices), "device": "cpu",
                "text_normalization": "off", "cpu_threads": 1},
        "engine": {"workers": 1, "max_batch_size": 2, "max_llm_len": 256, "worker_start_timeout_s": 120,
                   "flow_cache": True, "flow_cache_mib": 64},
        "audio": {"output_sample_rate": RATE},
    }  # fmt: skip
    async with running_gateway(overrides) as gw, httpx.AsyncClient(timeout=120) as client:
        reply = await client.post(f"{gw.url}/v1/tts", json={"text": "好。", "format": "pcm"})
        assert reply.status_code == 200 and len(reply.content) > 0
        health = (await client.get(f"{gw.url}/v1/health")).json()
        (worker,) = health["engine"]["workers"]
        for memory in (health["memory"]["engine"], worker["memory"]):  # the gateway's sum and the worker's own
            assert memory["flow_cache_limit_bytes"] == 64 << 20
            assert memory["flow_cache_voices"] == 1 and memory["flow_cache_voice_bytes"] > 0  # the preset's prefix
            assert memory["flow_cache_bytes"] == memory["flow_cache_voice_bytes"] + memory["flow_cache_stream_bytes"]
        metrics = (await client.get(f"{gw.url}/metrics")).text
        values = {
            line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("xz_engine_")
        }
        assert values["xz_engine_flow_cache_voice_bytes"] == health["memory"]["engine"]["flow_cache_voice_bytes"]
        assert values["xz_engine_steps_total"] > 0  # reported with the request's end, not only at hello


@pytest.mark.parametrize("workers", [0, 1])
async def test_a_callers_errors_are_the_same_4xx_in_process_and_in_a_worker(
    dirs: tuple[Path, Path], workers: int
) -> None:
    # issue 23: in a worker these were 500 (the backend's ValueError crossed the process boundary untyped)
    model_dir, voices = dirs
    overrides = {
        "tts": {"backend": "cosyvoice", "model_dir": str(model_dir), "voices_dir": str(voices), "device": "cpu",
                "text_normalization": "off", "cpu_threads": 1},
        "engine": {"workers": workers, "max_batch_size": 2, "max_llm_len": 256, "worker_start_timeout_s": 120},
        "audio": {"output_sample_rate": RATE},
    }  # fmt: skip
    long = "Hello there. " * 190  # 2,470 characters: under api.max_text_chars (4096), over the engine's 2000
    async with running_gateway(overrides) as gw, httpx.AsyncClient(timeout=120) as client:
        assert (await client.get(f"{gw.url}/v1/health")).json()["tts"]["max_text_chars"] == 2000  # announced
        for path, body in (
            ("/v1/tts", {"text": long}),
            ("/v1/audio/speech", {"model": "tts-1", "input": long, "voice": "default"}),
            ("/tts", {"text": long, "character": "default"}),
        ):
            reply = await client.post(f"{gw.url}{path}", json=body)
            error = reply.json()["error"]
            assert reply.status_code == 400 and error["code"] == "text_too_long", (path, reply.text)
            assert "the limit is 2000 (the cosyvoice engine's limit)" in error["message"]

        async def zero_shot(prompt_text: str) -> httpx.Response:
            files = {"prompt_wav": ("p.wav", prompt_wav(1.0), "audio/wav")}
            data = {"text": "好。", "prompt_text": prompt_text}
            return await client.post(f"{gw.url}/tts/zero_shot", data=data, files=files)

        reply = await zero_shot("你" * 5000)  # the transcript is over the engine's limit too
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt_text"
        # under the limits, but more prompt positions than a KV slot holds (max_llm_len 256): the backend
        # refuses it when the request opens, and that refusal arrives typed from the worker
        reply = await zero_shot("你好，欢迎。" * 60)
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["code"] == "refused_by_backend", reply.text
        assert "the KV cache holds 256" in error["message"]
        assert (await client.post(f"{gw.url}/v1/tts", json={"text": "好。"})).status_code == 200
