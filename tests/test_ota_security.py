"""OTA and the device socket with `server.auth` on, against a real server on loopback.

OTA never hands out an operator token; an admitted device gets a token that opens the socket for
its own Device-Id only; a connection without a token never replaces one that had a valid token;
bad identities get a 400; a refused upgrade logs no ERROR.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
import websockets

from scripts.device_sim import DeviceSimulator
from tests.gateway_server import running_gateway
from tts_engine.backends.fake import FakeBackend

OPERATOR = "operator-secret-token"
MAC = "02:00:00:aa:bb:cc"
OTHER = "02:00:00:dd:ee:ff"


def auth(**kw) -> dict:
    return {"server": {"auth": {"enabled": True, "tokens": [OPERATOR], "secret": "k" * 32, **kw}}}


async def refused_status(sim: DeviceSimulator) -> int:
    with pytest.raises(websockets.InvalidStatus) as info:
        await sim.connect()
    return info.value.response.status_code


async def test_anonymous_ota_never_gets_the_operator_token():
    async with running_gateway(auth(), backend=FakeBackend()) as gw:
        data = await DeviceSimulator(gw.url, device_id=MAC).ota()
        async with httpx.AsyncClient() as client:
            bare = (await client.post(f"{gw.url}/xiaozhi/ota/", json={})).json()
    assert data["websocket"]["token"] == "" and bare["websocket"]["token"] == ""
    assert OPERATOR not in str(data) and OPERATOR not in str(bare)


async def test_an_admitted_device_gets_a_token_for_its_own_id_only():
    async with running_gateway(auth(allowed_devices=[MAC]), backend=FakeBackend()) as gw:
        listed = DeviceSimulator(gw.url, device_id=MAC)
        token = (await listed.ota())["websocket"]["token"]
        assert token and token != OPERATOR
        assert (await DeviceSimulator(gw.url, device_id=OTHER).ota())["websocket"]["token"] == ""
        # the token opens the socket for MAC (with its Client-Id), not for another Device-Id
        assert await refused_status(DeviceSimulator(gw.url, device_id=OTHER, token=token)) == 401
        sim = DeviceSimulator(gw.url, device_id=MAC, client_id=listed.client_id, token=token)
        await sim.connect()
        assert gw.services.sessions[MAC].info.authenticated
        await sim.close()


async def test_ota_open_gives_any_device_a_token_bound_to_it():
    async with running_gateway(auth(ota_open=True), backend=FakeBackend()) as gw:
        sim = DeviceSimulator(gw.url, device_id=OTHER)
        sim.token = (await sim.ota())["websocket"]["token"]
        await sim.connect()
        await sim.close()
        assert await refused_status(DeviceSimulator(gw.url, device_id=MAC, token=sim.token)) == 401


async def test_a_connection_without_token_cannot_replace_an_authenticated_device():
    async with running_gateway(auth(allowed_devices=[MAC]), backend=FakeBackend()) as gw:
        real = DeviceSimulator(gw.url, device_id=MAC, token=OPERATOR)
        await real.connect()
        first = gw.services.sessions[MAC]
        # an allow-listed Device-Id is identification, not authentication
        assert await refused_status(DeviceSimulator(gw.url, device_id=MAC)) == 409
        assert await refused_status(DeviceSimulator(gw.url, device_id=MAC, token="wrong")) == 409
        await asyncio.sleep(0.1)
        assert gw.services.sessions[MAC] is first and not real.closed.is_set()
        turn = await real.ask("还在吗")
        assert turn.frames
        # the real device reconnecting with its token replaces its old session
        again = DeviceSimulator(gw.url, device_id=MAC, token=OPERATOR)
        await again.connect()
        await asyncio.wait_for(real.closed.wait(), 5)
        assert gw.services.sessions[MAC] is not first
        await again.close()
        await real.close()


async def test_without_tokens_on_either_side_a_reconnect_still_replaces():
    async with running_gateway(auth(allowed_devices=[MAC]), backend=FakeBackend()) as gw:
        old = DeviceSimulator(gw.url, device_id=MAC)
        await old.connect()
        new = DeviceSimulator(gw.url, device_id=MAC)
        await new.connect()
        await asyncio.wait_for(old.closed.wait(), 5)
        await new.close()
        await old.close()


async def test_oversized_or_unprintable_ids_are_refused():
    long_id = "A" * 6000
    async with running_gateway(backend=FakeBackend()) as gw:
        async with httpx.AsyncClient() as client:
            ota_long = await client.post(f"{gw.url}/xiaozhi/ota/", json={}, headers={"Device-Id": long_id})
            ota_client = await client.post(
                f"{gw.url}/xiaozhi/ota/", json={}, headers={"Device-Id": MAC, "Client-Id": "c" * 200}
            )
            ota_ok = await client.post(f"{gw.url}/xiaozhi/ota/", json={}, headers={"Device-Id": MAC})
        assert await refused_status(DeviceSimulator(gw.url, device_id=long_id)) == 400
        assert (
            await refused_status(DeviceSimulator(gw.url, device_id="a\x7fb", use_query_identity=True)) == 400
        )
        assert (
            await refused_status(DeviceSimulator(gw.url, device_id="a%00b", use_query_identity=True)) == 400
        )
        assert not gw.services.sessions
    assert ota_long.status_code == 400 and "Device-Id" in ota_long.json()["error"]
    assert ota_client.status_code == 400 and "Client-Id" in ota_client.json()["error"]
    assert ota_ok.status_code == 200


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_refused_upgrades_give_http_status_and_log_no_error():
    records = _Records()
    uvicorn_error = logging.getLogger("uvicorn.error")
    async with running_gateway(auth(), backend=FakeBackend()) as gw:
        uvicorn_error.addHandler(records)
        try:
            statuses = [
                await refused_status(DeviceSimulator(gw.url, device_id=MAC)),
                await refused_status(DeviceSimulator(gw.url, device_id=MAC, token="wrong")),
                await refused_status(DeviceSimulator(gw.url, device_id="x" * 500, token=OPERATOR)),
            ]
            async with websockets.connect(gw.ws_url, additional_headers={"Protocol-Version": "9"}) as _:
                pass
        except websockets.InvalidStatus as exc:
            statuses.append(exc.response.status_code)
        finally:
            await asyncio.sleep(0.1)
            uvicorn_error.removeHandler(records)
        ok = DeviceSimulator(gw.url, device_id=MAC, token=OPERATOR)
        await ok.connect()
        await ok.close()
    assert statuses == [401, 401, 400, 400]
    errors = [r.getMessage() for r in records.records if r.levelno >= logging.ERROR]
    assert errors == []


async def test_mac_addresses_match_whatever_their_case_or_separator():
    # issue 23: `AA:BB:..` was refused when `aa:bb:..` was listed (and the other way round)
    async with running_gateway(auth(allowed_devices=[MAC.upper()]), backend=FakeBackend()) as gw:
        for device_id in (MAC, MAC.upper(), MAC.upper().replace(":", "-")):
            sim = DeviceSimulator(gw.url, device_id=device_id)
            sim.token = (await sim.ota())["websocket"]["token"]
            assert sim.token, device_id  # admitted, with a token for its one normalised id
            await sim.connect()
            assert list(gw.services.sessions) == [MAC]  # stored lower case with colons
            turn = await sim.ask("在吗")
            assert turn.frames
            await sim.close()
            await asyncio.wait_for(_no_sessions(gw), 5)
        listed = DeviceSimulator(gw.url, device_id=MAC.upper())  # the allow-list without a token
        await listed.connect()
        await listed.close()


async def _no_sessions(gw) -> None:
    while len(gw.services.sessions):
        await asyncio.sleep(0.02)
