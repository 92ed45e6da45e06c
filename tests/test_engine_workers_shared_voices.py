"""Two gateways on the same engine worker and voice folder (deploy/docker-compose.yml's layout).

A voice added through one gateway is listed, described and usable through the other at once; one
removed through either is gone from both and is not brought back when the worker restarts and the
gateways replay their voices to it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from tests.api_helpers import CloningFakeBackend
from tests.gateway_server import RunningGateway, running_gateway
from tests.test_backend_cosyvoice import prompt_wav
from tts_engine import TTSEngine
from tts_engine.worker.server import WorkerServer


async def start_worker(port: int = 0) -> tuple[TTSEngine, WorkerServer, asyncio.AbstractServer, int]:
    engine = TTSEngine(CloningFakeBackend())
    await engine.start()
    server = WorkerServer(engine, listen=f"tcp://127.0.0.1:{port}")
    listener = await server.start()
    return engine, server, listener, listener.sockets[0].getsockname()[1]


async def stop_worker(engine: TTSEngine, server: WorkerServer, listener: asyncio.AbstractServer) -> None:
    listener.close()
    await server.close()
    await engine.close()


def gateway_config(port: int, voices: Path) -> dict[str, Any]:
    return {
        "tts": {"backend": "fake", "voices_dir": str(voices), "text_normalization": "off"},
        "engine": {"remote": [f"tcp://127.0.0.1:{port}"]},
        "api": {"unknown_voice": "strict"},
    }


async def listed(client: httpx.AsyncClient, gw: RunningGateway) -> dict[str, dict[str, Any]]:
    reply = await client.get(f"{gw.url}/v1/voices")
    assert reply.status_code == 200
    return {v["name"]: v for v in reply.json()["data"]}


async def until(condition: Any, timeout: float = 5.0) -> None:
    """Wait (bounded) for a change another gateway's request makes on this one."""
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.02)


async def test_voices_added_or_removed_through_one_gateway_reach_the_other(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    engine, server, listener, port = await start_worker()
    try:
        async with (
            running_gateway(gateway_config(port, voices)) as a,
            running_gateway(gateway_config(port, voices)) as b,
            httpx.AsyncClient(timeout=30) as client,
        ):
            files = {"prompt_wav": ("alice.wav", prompt_wav(1.5), "audio/wav")}
            data = {"name": "alice", "prompt_text": "你好。", "description": "added through A"}
            added = await client.post(f"{a.url}/v1/voices", data=data, files=files)
            assert added.status_code == 201, added.text

            async def b_has_alice() -> bool:
                alice = (await listed(client, b)).get("alice")
                return alice is not None and alice["loaded"]

            await until(b_has_alice)
            alice = (await listed(client, b))["alice"]
            assert alice["source"] == "preset" and alice["description"] == "added through A"
            spoken = await client.post(f"{b.url}/v1/tts", json={"text": "好。", "voice": "alice", "format": "pcm"})
            assert spoken.status_code == 200 and spoken.content

            assert (await client.delete(f"{b.url}/v1/voices/alice")).status_code == 204

            async def a_lost_alice() -> bool:
                return "alice" not in await listed(client, a)

            await until(a_lost_alice)
            refused = await client.post(f"{a.url}/v1/tts", json={"text": "好。", "voice": "alice", "format": "pcm"})
            assert refused.status_code in (400, 404) and refused.json()["error"]["code"] == "unknown_voice"
            assert not list(voices.glob("alice*"))

            # The worker restarts; both gateways reconnect and replay their run-time voices: not alice.
            await stop_worker(engine, server, listener)
            engine, server, listener, _ = await start_worker(port)
            slots = [slot for gw in (a, b) for slot in gw.services.engine.slots]  # type: ignore[union-attr]

            async def both_back() -> bool:
                return all(slot.state == "ready" for slot in slots)

            await until(both_back, timeout=20)
            assert "alice" not in engine.voices
            assert "alice" not in await listed(client, a) and "alice" not in await listed(client, b)
    finally:
        await stop_worker(engine, server, listener)
