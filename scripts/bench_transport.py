"""The transports of scripts/bench_gateway.py (`--transport websocket,mqtt`, `--udp-loss`): the server's
MQTT environment, one simulated device per transport, and frame gaps that do not count a lost packet
as a late one.

An MQTT device (scripts/device_sim_mqtt.py, firmware-like) asks OTA for its credentials, connects to
the gateway's MQTT listener and talks over encrypted UDP; `--udp-loss` drops that share of its
datagrams both ways (seeded per device). A lost downlink packet leaves a 120 ms hole between two
arrivals: that is loss (counted in `udp_lost_pct`, concealed by the device's decoder), not lateness,
so such gaps are left out of the late-frame shares.
"""

from __future__ import annotations

from typing import Any

from gateway.xiaozhi import AudioOut
from scripts.device_sim import DeviceSimulator, LostFrames, Turn

TRANSPORTS = ("websocket", "mqtt")


def transport_env(mqtt_port: int, udp_port: int) -> dict[str, str]:
    """The gateway's MQTT listener and UDP endpoint on loopback, MQTT for every device."""
    return {
        "XZ_TRANSPORT__MQTT__ENABLED": "true",
        "XZ_TRANSPORT__MQTT__ALL_DEVICES": "true",
        "XZ_TRANSPORT__MQTT__HOST": "127.0.0.1",
        "XZ_TRANSPORT__MQTT__PORT": str(mqtt_port),
        "XZ_TRANSPORT__UDP__HOST": "127.0.0.1",
        "XZ_TRANSPORT__UDP__PORT": str(udp_port),
        "XZ_TRANSPORT__MQTT__MAX_PACKETS_PER_S": "200",
        "XZ_SERVER__AUTH__SECRET": "bench-gateway-mqtt-credentials",  # signs the OTA credentials
    }


def make_device(url: str, transport: str, index: int, udp_loss: float = 0.0) -> DeviceSimulator:
    if transport == "websocket":
        return DeviceSimulator(url, decode=False)
    from scripts.device_sim_mqtt import Impairment, MqttDeviceSimulator

    return MqttDeviceSimulator(url, decode=False, uplink=Impairment(udp_loss, seed=2 * index),
                               downlink=Impairment(udp_loss, seed=2 * index + 1))  # fmt: skip


async def prepare_devices(sims: list[DeviceSimulator]) -> None:
    """MQTT devices ask OTA for their credentials (a device does at boot, long before it talks)."""
    import asyncio

    limit = asyncio.Semaphore(20)

    async def ota(sim: DeviceSimulator) -> None:
        async with limit:
            await sim.ota()

    await asyncio.gather(*(ota(sim) for sim in sims if hasattr(sim, "mqtt")))


async def open_device(sim: DeviceSimulator) -> Any:
    if getattr(sim, "mqtt", True) is None:
        await sim.ota()  # its MQTT credentials, when prepare_devices did not fetch them
    return await sim.connect()


def arrival_gaps(turn: Turn) -> list[float]:
    """Inter-arrival times of the turn's frames, leaving out each gap that a lost packet explains."""
    gaps: list[float] = []
    last: float | None = None
    lost = False
    for record in turn.records:
        if isinstance(record.event, LostFrames):
            lost = True
        elif isinstance(record.event, AudioOut):
            if last is not None and not lost:
                gaps.append(record.t - last)
            last, lost = record.t, False
    return gaps


def lost_frames(turn: Turn) -> int:
    return sum(r.event.packets for r in turn.records if isinstance(r.event, LostFrames))


async def udp_counters(url: str) -> dict[str, float]:
    """The gateway's UDP counters (xz_udp_*, from /metrics), to print beside an MQTT table."""
    import httpx

    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(f"{url}/metrics")).text
    counters: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("xz_udp_") and "_total" in line:
            name, value = line.rsplit(" ", 1)
            counters[name.replace("xz_udp_", "").replace("_total", "")] = float(value)
    return counters
