"""Shared pieces of the loopback device-protocol tests: a cheap fake TTS backend, a connected device."""

from __future__ import annotations

from scripts.device_sim import DeviceSimulator
from tts_engine.backends.fake import FakeBackend


def fake(**kw) -> FakeBackend:
    kw.setdefault("ms_per_char", 20.0)
    return FakeBackend(**kw)


async def connected(gw, **kw) -> DeviceSimulator:
    sim = DeviceSimulator(gw.url, **kw)
    await sim.connect()
    return sim
