"""Usage metering (gateway/service/usage.py): per key and day, the totals equal the sum of what was served
(requests, errors, characters, audio seconds counted by the client), across a restart of the gateway, on
both stores; ``GET /v1/usage`` shows a key its own and an admin everyone's; ``python -m gateway keys``
adds a key (printed once, only its hash kept), lists, revokes and reports the same usage."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from gateway.service.accounts import Account, Limits
from tests.api_helpers import fake
from tests.gateway_server import running_gateway
from tests.test_service_limits import add_key

ROOT = Path(__file__).resolve().parent.parent
ADMIN = {"Authorization": "Bearer sk-admin"}


async def serve(client: httpx.AsyncClient, url: str, key: str, texts: list[str]) -> float:
    """Speaks ``texts`` as raw PCM; the seconds of audio received."""
    seconds = 0.0
    for text in texts:
        reply = await client.post(f"{url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                                  json={"input": text, "voice": "alloy", "response_format": "pcm"})  # fmt: skip
        assert reply.status_code == 200
        seconds += len(reply.content) / 2 / 24000
    return seconds


async def test_usage_totals_equal_what_was_served_across_a_restart(store_url: str) -> None:
    config = {"store": {"url": store_url}, "api": {"api_keys": ["sk-admin"]}}
    first = ["Hello there.", "How are you today?", "One more, please."]
    second = ["After the restart.", "Still counted."]
    async with running_gateway(config, backend=fake()) as gw, httpx.AsyncClient(timeout=30) as client:
        key = await add_key(gw, Account(name="meter", limits=Limits(rps=100)))
        audio = await serve(client, gw.url, key, first)
        bad = await client.post(f"{gw.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                                json={"input": "x", "response_format": "nope"})  # fmt: skip
        assert bad.status_code == 400
    async with running_gateway(config, backend=fake()) as gw, httpx.AsyncClient(timeout=30) as client:
        audio += await serve(client, gw.url, key, second)
        mine = (await client.get(f"{gw.url}/v1/usage", headers={"Authorization": f"Bearer {key}"})).json()
        forbidden = await client.get(f"{gw.url}/v1/usage?key=other", headers={"Authorization": f"Bearer {key}"})
        await client.get(f"{gw.url}/v1/usage", headers=ADMIN)
        everyone = (await client.get(f"{gw.url}/v1/usage", headers=ADMIN)).json()  # the first read counted
    (total,) = mine["totals"]
    assert total["key"] == "meter"
    assert total["requests"] == len(first) + len(second) + 1
    assert total["errors"] == 1
    assert total["characters"] == sum(len(t) for t in first + second)
    assert abs(total["audio_seconds"] - audio) < 1e-3
    assert total["first_byte_ms"]["p50"] is not None
    assert forbidden.status_code == 403
    names = {t.get("key") for t in everyone["totals"]}
    assert "meter" in names and any(n and n.startswith("config-") for n in names)


def keys_cli(store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XZ_STORE__URL": store_url}
    return subprocess.run([sys.executable, "-m", "gateway", "keys", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


async def test_the_keys_cli_prints_a_key_once_and_reports_its_usage(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path}/store.db"
    added = keys_cli(store_url, "add", "bob", "--rps", "5", "--quota-chars", "1000")
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    assert key.startswith("sk-xz-") and "bob" in added.stderr
    assert key.encode() not in (tmp_path / "store.db").read_bytes()  # only its hash is kept
    assert hashlib.sha256(key.encode()).hexdigest().encode() in (tmp_path / "store.db").read_bytes()
    assert keys_cli(store_url, "add", "bob").returncode == 1  # the name is taken
    assert keys_cli(store_url, "add", "bad name!").returncode == 2
    async with running_gateway({"store": {"url": store_url}}, backend=fake()) as gw, httpx.AsyncClient(timeout=30) as client:
        audio = await serve(client, gw.url, key, ["Counted by the command line."])
        refused = await client.get(f"{gw.url}/v1/usage")
        assert refused.status_code == 401  # a key exists: none is needed no more
    listed = keys_cli(store_url, "list")
    assert listed.stdout.startswith("bob\tactive") and key not in listed.stdout
    usage = keys_cli(store_url, "usage", "bob", "--json")
    (row,) = [json.loads(line) for line in usage.stdout.splitlines()]
    assert row["key"] == "bob" and row["requests"] == 1 and row["characters"] == len("Counted by the command line.")
    assert abs(row["audio_seconds"] - audio) < 1e-3
    assert keys_cli(store_url, "revoke", "bob").returncode == 0
    assert keys_cli(store_url, "revoke", "bob").returncode == 1
    async with running_gateway({"store": {"url": store_url}}, backend=fake()) as gw, httpx.AsyncClient(timeout=30) as client:
        gone = await client.post(f"{gw.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                                 json={"input": "no more"})  # fmt: skip
    assert gone.status_code == 401


async def test_a_device_turn_is_metered_per_device() -> None:
    import asyncio

    from gateway.metrics import GatewayMetrics
    from gateway.service.usage import UsageMeter
    from gateway.speech.turns import usage_recorder
    from tests.test_turn import FIRST, SECOND, make_turn
    from tests.turn_fakes import ScriptedLLM

    meter = UsageMeter(None)
    turn, _ = make_turn(ScriptedLLM([FIRST, SECOND]), recorder=usage_recorder(GatewayMetrics(), meter, "aa:bb"))
    await asyncio.wait_for(turn.answer("q", [{"role": "user", "content": "q"}]), 10)
    (row,) = await meter.report()
    assert row.subject == "device:aa:bb" and row.requests == 1 and row.errors == 0
    assert row.characters == len(FIRST) + len(SECOND)
    assert turn.result is not None and abs(row.audio_s - turn.result.frames * 0.06) < 1e-6 and row.audio_s > 0
    assert sum(row.first_byte) == 1
