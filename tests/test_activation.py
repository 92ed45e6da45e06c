"""Activation by code through a real loopback gateway, as the firmware does it (ota.cc): the OTA reply's
`activation` object, `POST /xiaozhi/ota/activate` (202 until the code is entered, then 200), the device
token in the next OTA reply, the HMAC proof of activation v2, single-use and expiring codes, rate limits
per address, and `ota.activation: off` as before."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from sqlalchemy import update

from gateway.devices.tables import devices_codes
from scripts.device_sim import DeviceSimulator
from tests.gateway_server import RunningGateway, running_gateway
from tests.test_device_memory import RecordingLLM
from tts_engine.backends.fake import FakeBackend

MAC = "02:00:00:ac:00:01"
CODE_MODE = {"ota": {"activation": "code"}}


class Firmware:
    """The firmware's side of OTA and activation (headers and bodies as ota.cc sends them)."""

    def __init__(self, url: str, device_id: str = MAC, *, serial: str | None = None, key: bytes | None = None,
                 address: str | None = None) -> None:  # fmt: skip
        self.url = url
        self.device_id = device_id
        self.client_id = "3f0c7a9e-0000-4000-8000-00000000ac01"
        self.serial = serial
        self.key = key
        self.headers = {"Device-Id": device_id, "Client-Id": self.client_id, "User-Agent": "esp-box-3/2.4.2",
                        "Activation-Version": "2" if serial else "1"}  # fmt: skip
        if serial:
            self.headers["Serial-Number"] = serial
        if address:
            self.headers["X-Forwarded-For"] = address
        self.challenge = ""

    async def ota(self) -> dict[str, Any]:
        body = {"application": {"name": "xiaozhi", "version": "2.4.2"}, "board": {"type": "esp-box-3"},
                "mac_address": self.device_id}  # fmt: skip
        async with httpx.AsyncClient(timeout=10) as client:
            reply = await client.post(f"{self.url}/xiaozhi/ota/", json=body, headers=self.headers)
        assert reply.status_code == 200, reply.text
        data = reply.json()
        if "activation" in data:
            self.challenge = data["activation"]["challenge"]
        return data

    def payload(self, *, hmac_key: bytes | None = None) -> dict[str, Any]:
        if not self.serial:
            return {}
        key = hmac_key if hmac_key is not None else self.key or b""
        digest = hmac.new(key, self.challenge.encode(), hashlib.sha256).hexdigest()
        return {"algorithm": "hmac-sha256", "serial_number": self.serial, "challenge": self.challenge,
                "hmac": digest}  # fmt: skip

    async def activate(self, payload: dict[str, Any] | None = None) -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as client:
            return await client.post(
                f"{self.url}/xiaozhi/ota/activate", json=self.payload() if payload is None else payload,
                headers=self.headers,
            )  # fmt: skip


async def bind(gw: RunningGateway, code: str, agent: str | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(f"{gw.url}/v1/activations", json={"code": code, "agent": agent})


async def test_activation_off_keeps_todays_ota_and_records_the_device() -> None:
    async with running_gateway(backend=FakeBackend()) as gw:
        device = Firmware(gw.url)
        data = await device.ota()
        assert "activation" not in data and data["websocket"]["token"] == ""
        answer = await device.activate({})
        assert answer.status_code == 200 and answer.json() == {"success": True}
        await gw.call(gw.services.devices.settle())
        record = await gw.call(gw.services.devices.get(MAC))
        assert (record.board, record.firmware, record.state) == ("esp-box-3", "2.4.2", "seen")


async def test_a_new_device_gets_a_code_polls_202_is_bound_once_and_activates() -> None:
    auth = {"server": {"auth": {"enabled": True, "secret": "s" * 32}}}
    async with running_gateway({**CODE_MODE, **auth}, backend=FakeBackend()) as gw:
        device = Firmware(gw.url)
        first = await device.ota()
        activation = first["activation"]
        code = activation["code"]
        assert len(code) == 6 and code.isdigit()
        assert code in activation["message"] and len(activation["challenge"]) >= 16
        assert 590_000 <= activation["timeout_ms"] <= 600_000  # devices.code_ttl_s
        assert first["websocket"]["token"] == ""  # no token before activation
        again = await device.ota()  # the firmware checks OTA again after 10 polls: the same code
        assert (
            again["activation"]["code"] == code
            and again["activation"]["challenge"] == activation["challenge"]
        )

        assert (await device.activate()).status_code == 202
        sim = DeviceSimulator(gw.url, device_id=MAC, client_id=device.client_id, token="xzd1.0.d.x")
        with pytest.raises(websockets.InvalidStatus):
            await sim.connect()

        bound = await bind(gw, code)
        assert bound.status_code == 200, bound.text
        assert bound.json()["device_id"] == MAC and bound.json()["state"] == "bound"
        assert (await bind(gw, code)).status_code == 404  # single use
        done = await device.activate()
        assert done.status_code == 200 and done.json()["success"] is True
        assert (await device.activate()).status_code == 200  # polling on is harmless

        after = await device.ota()
        assert "activation" not in after
        token = after["websocket"]["token"]
        assert token.startswith("xzd1.")
        sim = DeviceSimulator(gw.url, device_id=MAC, client_id=device.client_id, token=token)
        await sim.connect()
        assert gw.services.sessions[MAC].info.authenticated
        await sim.close()


async def test_an_unactivated_device_hears_its_code_and_no_llm_is_asked() -> None:
    llm = RecordingLLM()
    async with running_gateway(CODE_MODE, backend=FakeBackend(), llm=llm) as gw:
        sim = DeviceSimulator(gw.url, device_id=MAC)
        code = (await sim.ota())["activation"]["code"]
        await sim.connect()
        await sim.listen_start("auto")
        turn = await sim.ask("你好")
        spoken = "".join(turn.sentences)
        assert " ".join(code) in spoken  # digit by digit
        assert turn.frames and not llm.chats
        await sim.close()


async def test_a_code_expires_and_the_next_ota_brings_a_new_one() -> None:
    async with running_gateway(CODE_MODE, backend=FakeBackend()) as gw:
        device = Firmware(gw.url)
        old_activation = (await device.ota())["activation"]
        old = old_activation["code"]

        async def expire() -> None:
            async with gw.services.store.write() as conn:
                await conn.execute(update(devices_codes).values(expires_at=time.time() - 1))

        await gw.call(expire())
        assert (await bind(gw, old)).status_code == 404
        assert (await device.activate()).status_code == 404  # nothing pending: check OTA again
        new = (await device.ota())["activation"]
        assert new["challenge"] != old_activation["challenge"]  # a new code, with a new challenge
        assert (await bind(gw, new["code"])).status_code == 200


def keys_file(tmp_path: Path, serial: str, key: bytes) -> str:
    path = tmp_path / "keys.txt"
    path.write_text(f"# serial key\n{serial} hex:{key.hex()}\n", encoding="utf-8")
    return str(path)


async def test_activation_v2_checks_the_hmac_of_the_challenge(tmp_path: Path) -> None:
    key = bytes(range(32))
    cfg = {**CODE_MODE, "devices": {"activation_keys_file": keys_file(tmp_path, "SN-0001", key)}}
    async with running_gateway(cfg, backend=FakeBackend()) as gw:
        device = Firmware(gw.url, serial="SN-0001", key=key)
        code = (await device.ota())["activation"]["code"]
        assert (await bind(gw, code)).status_code == 200
        wrong = await device.activate(device.payload(hmac_key=b"not the key"))
        assert wrong.status_code == 403 and "HMAC" in wrong.json()["message"]
        stale = dict(device.payload(), challenge="0" * 32)
        assert (await device.activate(stale)).status_code == 403
        missing = {"serial_number": "SN-0001"}
        assert (await device.activate(missing)).status_code == 403
        assert (await device.activate()).status_code == 200  # the right HMAC


async def test_required_hmac_refuses_unknown_serials_and_v1_devices(tmp_path: Path) -> None:
    key = b"k" * 32
    cfg = {**CODE_MODE, "devices": {"activation_hmac": "required",
                                    "activation_keys_file": keys_file(tmp_path, "SN-KNOWN", key)}}  # fmt: skip
    async with running_gateway(cfg, backend=FakeBackend()) as gw:
        v1 = Firmware(gw.url, "02:00:00:ac:00:02")
        await bind(gw, (await v1.ota())["activation"]["code"])
        assert (await v1.activate({})).status_code == 403
        stranger = Firmware(gw.url, "02:00:00:ac:00:03", serial="SN-OTHER", key=key)
        await stranger.ota()
        assert (await stranger.activate()).status_code == 403
        known = Firmware(gw.url, "02:00:00:ac:00:04", serial="SN-KNOWN", key=key)
        await bind(gw, (await known.ota())["activation"]["code"])
        assert (await known.activate()).status_code == 200


async def test_optional_hmac_lets_a_v1_device_activate_by_its_code() -> None:
    async with running_gateway(CODE_MODE, backend=FakeBackend()) as gw:
        device = Firmware(gw.url)
        await bind(gw, (await device.ota())["activation"]["code"])
        assert (await device.activate({})).status_code == 200


async def test_new_devices_and_refused_activations_are_rate_limited_per_address() -> None:
    cfg = {**CODE_MODE, "server": {"trust_forwarded_headers": True},
           "devices": {"new_per_address": 3, "activate_failures_per_address": 2}}  # fmt: skip
    async with running_gateway(cfg, backend=FakeBackend()) as gw:
        for i in range(3):
            await Firmware(gw.url, f"02:00:00:ac:01:0{i}", address="203.0.113.9").ota()
        async with httpx.AsyncClient(timeout=10) as client:
            fourth = Firmware(gw.url, "02:00:00:ac:01:09", address="203.0.113.9")
            refused = await client.post(f"{gw.url}/xiaozhi/ota/", json={}, headers=fourth.headers)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
        # a device it knows still gets its code, and another address is not affected
        assert "activation" in await Firmware(gw.url, "02:00:00:ac:01:00", address="203.0.113.9").ota()
        assert "activation" in await Firmware(gw.url, "02:00:00:ac:01:08", address="198.51.100.1").ota()
        # refused activations (a stale challenge) are counted per address
        prober = Firmware(gw.url, "02:00:00:ac:01:00", address="203.0.113.9")
        await prober.ota()
        stale = {"challenge": "nope"}
        assert [(await prober.activate(stale)).status_code for _ in range(3)] == [403, 403, 429]


async def test_bad_input_on_activation_is_a_clear_4xx() -> None:
    async with running_gateway(CODE_MODE, backend=FakeBackend()) as gw:
        async with httpx.AsyncClient(timeout=10) as client:
            no_id = await client.post(f"{gw.url}/xiaozhi/ota/activate", json={})
            bad_json = await client.post(f"{gw.url}/xiaozhi/ota/activate", content=b"{not json",
                                         headers={"Device-Id": MAC})  # fmt: skip
            unknown = await client.post(
                f"{gw.url}/xiaozhi/ota/activate", json={}, headers={"Device-Id": "ghost"}
            )
            bad_code = await client.post(f"{gw.url}/v1/activations", json={"code": "12ab56"})
            extra = await client.post(f"{gw.url}/v1/activations", json={"code": "123456", "x": 1})
        assert (no_id.status_code, bad_json.status_code, unknown.status_code) == (400, 400, 404)
        assert bad_code.status_code == 400 and bad_code.json()["error"]["code"] == "invalid_code"
        assert extra.status_code == 400
