"""A session's tools: which sources a turn offers, and what the built-in tools do to the session.

Sources by priority: the device's MCP tools, the server's MCP servers (shared by every session),
the built-ins (gateway/tools/builtins.py); a turn offers those its device's agent allows (``AgentTools``). `change_voice` sets the voice of the session's
following sentences; `end_conversation` asks the session to close once the reply has played.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.agents.profile import AgentTools
from gateway.config import Config
from gateway.speech.voice_choice import VoiceChoice
from gateway.tools.base import ToolSource
from gateway.tools.builtins import BuiltinTools, SessionControls

log = logging.getLogger(__name__)


class SessionTools:
    def __init__(
        self,
        config: Config,
        *,
        session_id: str,
        voices: Callable[[], list[str]],
        voice: VoiceChoice,
        shared: list[ToolSource],  # read at each turn: sources added later count
        device: Callable[[], ToolSource | None],  # the device's MCP client, once it has one
    ) -> None:
        self._session_id = session_id
        self.voice = voice
        self._shared = shared
        self._device = device
        self.end_requested = False  # the end_conversation tool was called in this reply
        self._controls = SessionControls(
            voices=voices,
            set_voice=self._change_voice,
            end_conversation=self._end_after_reply,
            utc_offset_minutes=config.ota.timezone_offset_minutes,
        )
        self.builtins = BuiltinTools(self._controls, config.tools.builtins)
        self._agent_builtins: dict[tuple[str, ...], BuiltinTools] = {}

    def sources(self, policy: AgentTools | None = None) -> list[ToolSource]:
        """This turn's tools, by priority: the device's, the server's MCP servers, the built-ins; with a
        ``policy`` (the device's agent) only those it allows."""
        device = self._device()
        if policy is None:
            return [*([device] if device is not None else []), *self._shared, self.builtins]
        servers = policy.mcp_servers
        shared = [s for s in self._shared if servers is None or s.name.removeprefix("mcp:") in servers]
        return [*([device] if device is not None and policy.device else []), *shared, self._builtins(policy)]

    def _builtins(self, policy: AgentTools) -> BuiltinTools:
        key = tuple(policy.builtins)
        tools = self._agent_builtins.get(key)
        if tools is None:
            tools = self._agent_builtins[key] = BuiltinTools(self._controls, policy.builtins)
        return tools

    def _change_voice(self, voice: str) -> None:
        log.info("session %s: voice changed to %s", self._session_id, voice)
        self.voice.change(voice)

    def _end_after_reply(self) -> None:
        self.end_requested = True
