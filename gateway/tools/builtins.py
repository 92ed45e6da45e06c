"""Tools the gateway itself offers the LLM: end the conversation, change the voice, tell the time.

They act on one session through ``SessionControls``. What the incumbent's plugins offer without an
outside service (its ``handle_exit_intent``, ``change_role`` voice part and ``get_time``) is here;
weather, news, music and home automation need outside services and are left to MCP servers.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.config import BUILTIN_TOOL_NAMES
from gateway.tools.base import ToolError, ToolSpec

__all__ = ["BUILTIN_TOOLS", "BuiltinTools", "SessionControls"]

BUILTIN_TOOLS = BUILTIN_TOOL_NAMES
_warned: set[str] = set()  # unknown names in tools.builtins, logged once per process
log = logging.getLogger(__name__)
_WEEKDAYS_ZH = "一二三四五六日"


@dataclass
class SessionControls:
    """What built-in tools may do to their session."""

    voices: Callable[[], list[str]]  # the voices the engine can speak now
    set_voice: Callable[[str], None]  # for this session's following sentences
    end_conversation: Callable[[], None]  # close the session once the current reply has played
    utc_offset_minutes: int = 480  # the users' local time (ota.timezone_offset_minutes)
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)


class BuiltinTools:
    """A ``ToolSource`` with the enabled built-in tools of one session."""

    name = "builtin"

    def __init__(
        self, controls: SessionControls, enabled: list[str] | tuple[str, ...] = BUILTIN_TOOLS
    ) -> None:
        unknown = sorted(set(enabled) - set(BUILTIN_TOOLS) - _warned)
        if unknown:
            _warned.update(unknown)
            log.warning("unknown built-in tools %s ignored; they are %s", unknown, ", ".join(BUILTIN_TOOLS))
        self._controls = controls
        self._enabled = [name for name in BUILTIN_TOOLS if name in enabled]

    async def list_tools(self) -> list[ToolSpec]:
        specs: dict[str, ToolSpec | Callable[[], ToolSpec | None]] = {
            "end_conversation": ToolSpec(
                "end_conversation",
                "End the conversation when the user says goodbye or asks to stop talking. "
                "Say a short goodbye in the same reply; the device disconnects after it.",
                {"type": "object", "properties": {}},
            ),
            "change_voice": self._change_voice_spec,
            "get_time": ToolSpec(
                "get_time",
                "Get the current local date, weekday and time.",
                {"type": "object", "properties": {}},
            ),
        }
        out: list[ToolSpec] = []
        for name in self._enabled:
            entry = specs[name]
            spec = entry if isinstance(entry, ToolSpec) else entry()
            if spec is not None:
                out.append(spec)
        return out

    def _change_voice_spec(self) -> ToolSpec | None:
        voices = self._controls.voices()
        if len(voices) < 2:
            return None  # nothing to change to
        return ToolSpec(
            "change_voice",
            "Change the voice you speak with, from now on in this conversation.",
            {
                "type": "object",
                "properties": {"voice": {"type": "string", "enum": voices, "description": "the new voice"}},
                "required": ["voice"],
            },
        )

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if name not in self._enabled:
            raise ToolError(f"unknown tool: {name}")
        if name == "end_conversation":
            self._controls.end_conversation()
            return "The conversation ends after this reply. Say a short goodbye."
        if name == "change_voice":
            voice = arguments.get("voice")
            voices = self._controls.voices()
            if not isinstance(voice, str) or voice not in voices:
                raise ToolError(f"no voice {voice!r}; the voices are: {', '.join(voices)}")
            self._controls.set_voice(voice)
            return f"The voice is now {voice}."
        return self._time()

    def _time(self) -> str:
        offset = dt.timedelta(minutes=self._controls.utc_offset_minutes)
        local = self._controls.now().astimezone(dt.timezone(offset))
        return (
            f"{local:%Y-%m-%d %H:%M}, weekday: {local:%A} (星期{_WEEKDAYS_ZH[local.weekday()]}), "
            f"time zone UTC{local:%z}"
        )
