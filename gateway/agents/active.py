"""Which agent a device talks with now: read at every turn, so an edit or a new binding applies from the
device's next turn, with no restart and no reconnect.

``Agents.for_device`` reads the device's row, its agent's stored profile and its activation code in one
query, within ``devices.lookup_timeout_s``. Without a Device-Id, without a row, or with no agent, the
device talks with the default agent (the config's keys). With the store down or too slow, a turn
degrades to the default agent with no memory; while the store is known to be down a turn does not wait
for it at all (one probe runs in the background and brings it back), only a session's hello does.
With ``ota.activation: code`` a device that has not activated hears how to activate instead of answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from pydantic import ValidationError

from gateway.agents.profile import DEFAULT_AGENT, AgentProfile, default_profile
from gateway.agents.store import AgentStore, parse_profile
from gateway.config import Config
from gateway.devices.activation import spoken_code
from gateway.devices.registry import DeviceRegistry, DeviceState
from gateway.store import Store, StoreError

__all__ = ["ActiveAgent", "Agents"]

log = logging.getLogger(__name__)

PROFILE_CACHE = 256  # parsed profiles kept, by (agent, version)


@dataclass(frozen=True)
class ActiveAgent:
    """The agent of one turn."""

    profile: AgentProfile
    version: int = 0  # 0: the default agent
    memory: bool = False  # remember this turn (the agent's memory, the store reachable, a Device-Id)
    degraded: bool = False  # the store could not say: the default agent, no memory
    activation: str | None = None  # the device must activate first: what it hears instead of answers

    @property
    def name(self) -> str:
        return self.profile.name


class Agents:
    """The gateway's agents: the default one, the stored ones, and each device's (one per gateway)."""

    def __init__(self, config: Config, store: Store, registry: DeviceRegistry) -> None:
        self.config = config
        self.default = default_profile(config)
        self.store = AgentStore(store, max_agents=config.agents.max_agents)
        self.registry = registry
        self.code_mode = config.ota.activation == "code"
        self._profiles: OrderedDict[tuple[str, int], AgentProfile] = OrderedDict()
        self._probe: asyncio.Task[None] | None = None

    def default_agent(self, *, degraded: bool = False, device_id: str | None = None) -> ActiveAgent:
        memory = self.default.memory and not degraded and bool(device_id)
        return ActiveAgent(self.default, 0, memory=memory, degraded=degraded)

    async def for_device(self, device_id: str | None, *, wait: bool = True) -> ActiveAgent:
        """The device's agent now. ``wait=False`` (a turn): while the store is known to be down, the
        default agent at once (and a background probe) rather than a wait for the store's bound."""
        if not device_id:
            return self.default_agent()
        store = self.store.store
        if not wait and store.status()["state"] == "unavailable":
            self._start_probe(device_id)
            return self.default_agent(degraded=True)
        try:
            state = await self.registry.state(device_id)
        except StoreError as exc:
            log.debug("device %s: agent not read (%s); the default agent, no memory", device_id, exc)
            return self.default_agent(degraded=True)
        return self._active(device_id, state)

    def _active(self, device_id: str, state: DeviceState | None) -> ActiveAgent:
        if self.code_mode and (state is None or not state.activated):
            return ActiveAgent(self.default, 0, memory=False, activation=self.activation_sentence(state))
        if state is None or state.agent_profile is None or state.agent is None:
            return self.default_agent(device_id=device_id)
        profile = self._profile(state.agent, state.agent_version, state.agent_profile)
        if profile is None:
            return self.default_agent(device_id=device_id)
        return ActiveAgent(profile, state.agent_version, memory=profile.memory)

    def activation_sentence(self, state: DeviceState | None) -> str:
        if state is not None and state.code is not None:
            return self.config.devices.activation_message.format(code=spoken_code(state.code))
        return self.config.devices.not_activated_message

    def _profile(self, name: str, version: int, text: str) -> AgentProfile | None:
        key = (name, version)
        profile = self._profiles.get(key)
        if profile is None:
            try:
                profile = parse_profile(text)
            except (ValidationError, ValueError) as exc:
                log.warning("agent %s (version %d) in the store is not valid, using the default: %s",
                            name, version, exc)  # fmt: skip
                return None
            self._profiles[key] = profile
            while len(self._profiles) > PROFILE_CACHE:
                self._profiles.popitem(last=False)
        self._profiles.move_to_end(key)
        return profile

    def _start_probe(self, device_id: str) -> None:
        """One background read while the store is down: its success marks the store available again."""
        if self._probe is not None and not self._probe.done():
            return

        async def probe() -> None:
            try:
                await self.registry.state(device_id, timeout_s=self.store.store.timeout_s)
            except StoreError:
                pass

        self._probe = asyncio.get_running_loop().create_task(probe(), name="agents-store-probe")

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.wait([self._probe], timeout=1.0)

    def is_default(self, name: str | None) -> bool:
        return name in (None, "", DEFAULT_AGENT)
