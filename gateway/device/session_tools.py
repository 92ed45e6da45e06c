"""A session's tools: which sources a turn offers, and what the built-in tools do to the session.

Sources by priority: the device's MCP tools, the server's MCP servers (shared by every session),
the built-ins (gateway/tools/builtins.py). `change_voice` sets the voice of the session's
following sentences; `end_conversation` asks the session to close once the reply has played.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

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
        self.builtins = BuiltinTools(
            SessionControls(
                voices=voices,
                set_voice=self._change_voice,
                end_conversation=self._end_after_reply,
                utc_offset_minutes=config.ota.timezone_offset_minutes,
            ),
            config.tools.builtins,
        )

    def sources(self) -> list[ToolSource]:
        """This turn's tools, by priority: the device's, the server's MCP servers, the built-ins."""
        device = self._device()
        return [*([device] if device is not None else []), *self._shared, self.builtins]

    def _change_voice(self, voice: str) -> None:
        log.info("session %s: voice changed to %s", self._session_id, voice)
        self.voice.change(voice)

    def _end_after_reply(self) -> None:
        self.end_requested = True
