"""The device registry on both store engines (a SQLite file, a real PostgreSQL server): what OTA and
connections record, its bounds (fields cut, unbound devices expire, at most max_unbound), binding by code
(single use, expiry, unknown agent), online state and latencies through the heartbeat, kicks, deletes."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select, update

from gateway.agents.profile import AgentProfile
from gateway.agents.store import AGENTS_SCHEMA, AgentStore
from gateway.config import DevicesConfig
from gateway.devices.registry import CodeNotFound, DeviceRegistry, DeviceReport
from gateway.devices.tables import DEVICES_SCHEMA, devices_codes, devices_devices
from gateway.store import StoreConflict

STORE_TEST_SCHEMAS = (AGENTS_SCHEMA, DEVICES_SCHEMA)


def registry(store, **cfg) -> DeviceRegistry:
    return DeviceRegistry(store, DevicesConfig(**cfg), name="gw-test")


async def age(store, device_id: str, seconds: float) -> None:
    """Makes a device look last seen ``seconds`` ago."""
    async with store.write() as conn:
        await conn.execute(
            update(devices_devices)
            .where(devices_devices.c.device_id == device_id)
            .values(last_seen=time.time() - seconds)
        )


async def test_an_ota_check_records_what_the_device_tells(store) -> None:
    reg = registry(store)
    headers = {"user-agent": "esp-box-3/2.4.2", "serial-number": "SN0001", "activation-version": "2"}
    body = {"application": {"version": "2.4.2"}, "board": {"type": "esp-box-3"}}
    report = DeviceReport.from_ota("aa:bb:cc:dd:ee:01", "client-1", headers, body, "10.0.0.7")
    record = await reg.seen(report)
    assert record is not None
    assert (record.board, record.firmware, record.serial_number, record.address) == (
        "esp-box-3", "2.4.2", "SN0001", "10.0.0.7")  # fmt: skip
    assert record.state == "seen" and record.agent is None and not record.online
    first = record.first_seen
    # a second check moves last seen, keeps first seen; the User-Agent stands in for a body without them
    again = await reg.seen(
        DeviceReport.from_ota("aa:bb:cc:dd:ee:01", None, {"user-agent": "kit/2.5.0"}, {}, None)
    )
    assert again is not None
    assert again.first_seen == first and again.last_seen >= first
    assert (again.board, again.firmware, again.client_id) == ("kit", "2.5.0", "client-1")


async def test_what_a_device_sends_is_cut_to_its_column_and_cleaned(store) -> None:
    reg = registry(store)
    headers = {"user-agent": "x" * 5000, "serial-number": "S\x00N" + "9" * 500}
    body = {"application": {"version": "1." * 400}, "board": {"type": ["not", "a", "string"]}}
    record = await reg.seen(DeviceReport.from_ota("dev-long", "c" * 128, headers, body, None))
    assert record is not None
    assert len(record.user_agent or "") == 160 and len(record.firmware or "") == 32
    assert record.serial_number is not None and "\x00" not in record.serial_number
    assert len(record.serial_number) == 64
    assert record.board == "x" * 64  # the body's board is not a string: the User-Agent's


async def test_devices_that_never_activate_expire_and_bound_ones_stay(store) -> None:
    reg = registry(store, unbound_ttl_s=3600)
    for name in ("old", "recent", "kept"):
        await reg.seen(DeviceReport(device_id=name))
    await AgentStore(store).create(AgentProfile(name="kid"))
    await reg.set_agent("kept", "kid")
    await age(store, "old", 7200)
    await age(store, "kept", 7200)
    assert await reg.expire() == 1
    ids = {r.device_id for r in await reg.list_devices()}
    assert ids == {"recent", "kept"}


async def test_at_most_max_unbound_devices_are_kept_the_least_recently_seen_go(store) -> None:
    reg = registry(store, max_unbound=10)
    await AgentStore(store).create(AgentProfile(name="kid"))
    await reg.seen(DeviceReport(device_id="bound"))
    await reg.set_agent("bound", "kid")
    for i in range(25):
        await reg.seen(DeviceReport(device_id=f"flood-{i:02d}"))
    records = await reg.list_devices(limit=500)
    unbound = sorted(r.device_id for r in records if r.state == "seen")
    assert len(unbound) == 10
    assert unbound == [f"flood-{i:02d}" for i in range(15, 25)]  # the newest stay
    assert any(r.device_id == "bound" for r in records)  # a bound device is never evicted
    assert (await reg.count()) == {"seen": 10, "bound": 1}


async def test_a_code_binds_its_device_once(store) -> None:
    reg = registry(store)
    await AgentStore(store).create(AgentProfile(name="kid"))
    await reg.seen(DeviceReport(device_id="dev-1"))
    await reg.add_code("dev-1", "123456", "challenge-1", "10.0.0.1")
    with pytest.raises(LookupError, match="no agent"):
        await reg.bind("123456", "nobody")
    assert (await reg.get("dev-1")).pending_code  # a refused bind leaves the code waiting
    record = await reg.bind("123456", "kid")
    assert (record.device_id, record.state, record.agent) == ("dev-1", "bound", "kid")
    assert record.activated_at is None and not record.pending_code
    with pytest.raises(CodeNotFound):
        await reg.bind("123456", "kid")  # single use
    state = await reg.state("dev-1")
    assert state is not None and state.code_bound and not state.activated
    assert await reg.complete_activation("dev-1")
    state = await reg.state("dev-1")
    assert state is not None and state.activated and state.code is None  # the code is gone


async def test_an_expired_or_unknown_code_binds_nothing(store) -> None:
    reg = registry(store)
    await reg.seen(DeviceReport(device_id="dev-1"))
    await reg.add_code("dev-1", "111111", "c", None)
    async with store.write() as conn:
        await conn.execute(update(devices_codes).values(expires_at=time.time() - 1))
    with pytest.raises(CodeNotFound):
        await reg.bind("111111", None)
    with pytest.raises(CodeNotFound):
        await reg.bind("999999", None)
    assert (await reg.get("dev-1")).state == "seen"


async def test_a_code_held_by_one_device_is_refused_for_another(store) -> None:
    reg = registry(store)
    for name in ("a", "b"):
        await reg.seen(DeviceReport(device_id=name))
    await reg.add_code("a", "222222", "c", None)
    with pytest.raises(StoreConflict):
        await reg.add_code("b", "222222", "c", None)
    # a device's new code replaces its old one
    await reg.add_code("a", "333333", "c2", None)
    async with store.read() as conn:
        codes = (await conn.execute(select(devices_codes.c.code))).scalars().all()
    assert codes == ["333333"]


async def test_live_codes_are_capped(store) -> None:
    reg = registry(store, max_pending_codes=10)
    for i in range(10):
        await reg.seen(DeviceReport(device_id=f"d{i}"))
        await reg.add_code(f"d{i}", f"{i:06d}", "c", None)
    await reg.seen(DeviceReport(device_id="late"))
    with pytest.raises(RuntimeError, match="waiting for activation"):
        await reg.add_code("late", "999999", "c", None)


async def test_online_state_latencies_and_kicks_go_through_the_heartbeat(store) -> None:
    reg = registry(store, heartbeat_s=1, latency_turns=3)
    await reg.connected("dev-1", "client-1")  # a device that skipped OTA is recorded too
    record = await reg.get("dev-1")
    assert record.online and record.gateway == "gw-test"
    for seconds in (0.4, 0.5, 0.6, 0.7):
        reg.turn_latency("dev-1", seconds)
    assert await reg.heartbeat() == []
    assert (await reg.get("dev-1")).latency_ms == [500.0, 600.0, 700.0]  # the last latency_turns
    other = registry(store)  # the CLI, or another gateway
    assert await other.kick("dev-1")
    assert await reg.heartbeat() == ["dev-1"]
    await reg.disconnected("dev-1")
    record = await reg.get("dev-1")
    assert not record.online and record.gateway is None


async def test_a_device_counts_online_only_while_its_gateway_renews_it(store) -> None:
    reg = registry(store, heartbeat_s=1)
    await reg.connected("dev-1", None)
    async with store.write() as conn:  # the gateway vanished 3 heartbeats ago
        await conn.execute(update(devices_devices).values(online_until=time.time() - 0.5))
    assert not (await reg.get("dev-1")).online


async def test_the_agent_of_a_device_comes_with_its_state_and_deleting_an_agent_frees_its_devices(
    store,
) -> None:
    reg = registry(store)
    agents = AgentStore(store)
    await agents.create(AgentProfile(name="kid", voice="v1"))
    await reg.seen(DeviceReport(device_id="dev-1"))
    await reg.set_agent("dev-1", "kid")
    state = await reg.state("dev-1")
    assert state is not None and state.agent == "kid" and state.agent_version == 1
    assert '"voice":"v1"' in (state.agent_profile or "")
    assert await agents.delete("kid")
    state = await reg.state("dev-1")
    assert state is not None and state.agent is None and state.agent_profile is None
    assert state.bound  # still kept: the operator claimed it


async def test_deleting_a_device_takes_its_code(store) -> None:
    reg = registry(store)
    await reg.seen(DeviceReport(device_id="dev-1"))
    await reg.add_code("dev-1", "444444", "c", None)
    assert await reg.delete("dev-1")
    assert not await reg.delete("dev-1")
    async with store.read() as conn:
        assert (await conn.execute(select(devices_codes))).all() == []
