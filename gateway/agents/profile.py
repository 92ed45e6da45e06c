"""What an agent is: a named profile a device talks with (role, greeting, voice, LLM, tools, memory, idle).

``AgentProfile`` is validated on the way in (the management API, the CLI, the store) and every field is
bounded, so a stored agent can always be spoken with. The default agent is built from today's config
keys (``default_profile``): a config without agents behaves as before, and a device with no agent (or
whose agent was deleted) talks with it.

LLM keys: ``llm.api_key`` is a reference or a key. ``config`` (the default) uses ``llm.api_key`` of the
config, ``env:NAME`` the gateway's environment variable NAME (the key never reaches the store), ``""`` no
key; anything else is a key typed in by an operator, kept in the store as asked and never shown back in
full: ``masked_key`` shows its last four characters. A masked value sent back unchanged keeps the key.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.config import BUILTIN_TOOL_NAMES, Config

__all__ = [
    "AGENT_NAME", "DEFAULT_AGENT", "AgentLLM", "AgentProfile", "AgentTools", "default_profile", "masked_key",
    "resolve_key",
]  # fmt: skip

DEFAULT_AGENT = "default"  # the name of the agent built from the config (never stored)
AGENT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")
KEY_CONFIG = "config"
KEY_ENV = "env:"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MASK = "****"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class AgentLLM(_Model):
    """The agent's chat model: an OpenAI-compatible endpoint (or the built-in echo)."""

    provider: Literal["echo", "openai"] = "echo"
    base_url: str = Field("https://api.openai.com/v1", max_length=512)
    model: str = Field("gpt-4o-mini", min_length=1, max_length=128)
    api_key: str = Field(KEY_CONFIG, max_length=512, repr=False)  # a reference or a key (module docstring)
    temperature: float | None = Field(None, ge=0, le=2)

    @field_validator("base_url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v

    @field_validator("api_key")
    @classmethod
    def _key(cls, v: str) -> str:
        if v.startswith(KEY_ENV) and not _ENV_NAME.match(v[len(KEY_ENV) :]):
            raise ValueError("env:NAME names an environment variable (letters, digits, _)")
        if any(ch.isspace() or not ch.isprintable() for ch in v):
            raise ValueError("a key holds no spaces or control characters")
        return v


class AgentTools(_Model):
    """Which tools the agent's LLM may call: the device's own (MCP), the server's MCP servers, built-ins."""

    device: bool = True
    mcp_servers: list[str] | None = Field(None, max_length=64)  # None: every configured server
    builtins: list[str] = Field(default_factory=lambda: list(BUILTIN_TOOL_NAMES), max_length=16)

    @field_validator("builtins")
    @classmethod
    def _builtins(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - set(BUILTIN_TOOL_NAMES))
        if unknown:
            raise ValueError(f"unknown built-in tools {unknown}; they are {', '.join(BUILTIN_TOOL_NAMES)}")
        return [name for name in BUILTIN_TOOL_NAMES if name in v]

    @field_validator("mcp_servers")
    @classmethod
    def _servers(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        for name in v:
            if not name or len(name) > 64 or not name.isprintable():
                raise ValueError("MCP server names: 1-64 printable characters")
        return list(dict.fromkeys(v))


class AgentProfile(_Model):
    """One agent. Every field has a bound; ``version`` counts its edits (0: the default agent)."""

    name: str = Field(min_length=1, max_length=48)
    description: str = Field("", max_length=200)
    role_prompt: str = Field("", max_length=8000)  # the LLM's system prompt
    greeting: str = Field("你好，我在呢，有什么可以帮你？", min_length=1, max_length=500)
    voice: str = Field("", max_length=64)  # "" = the engine's default voice
    speed: float = Field(1.0, ge=0.5, le=2.0)
    instruct: str = Field("", max_length=200)  # CosyVoice3 instruct text ("" = none)
    llm: AgentLLM = Field(default_factory=AgentLLM)
    language: str = Field("", max_length=32)  # "" = as the user speaks; else the LLM is told to reply in it
    tools: AgentTools = Field(default_factory=AgentTools)
    memory: bool = False  # remember the device's conversations across connections (in the store)
    memory_summary_chars: int = Field(1000, ge=50, le=20000)
    idle_no_voice_s: float = Field(120, gt=0, le=86400)
    idle_hard_s: float = Field(180, gt=0, le=86400)
    expressive: bool = False  # the reply's emotion picks its instruct text (agents.expressive_instructs)
    vision_model: str = Field("", max_length=128)  # "" = vision.model (on the vision section's endpoint)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not AGENT_NAME.match(v):
            raise ValueError(
                "lower-case letters, digits, '-' and '_' (1-48, starting with a letter or digit)"
            )
        return v

    @field_validator("voice")
    @classmethod
    def _voice(cls, v: str) -> str:
        if v and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", v):
            raise ValueError("a voice name: letters, digits, '_', '-', '.'")
        return v

    @field_validator("language")
    @classmethod
    def _language(cls, v: str) -> str:
        if v and not all(ch.isalnum() or ch in "-_ " for ch in v):
            raise ValueError("a language name or code such as zh-CN, en, 粤语")
        return v

    @field_validator("description", "role_prompt", "greeting", "instruct")
    @classmethod
    def _printable(cls, v: str) -> str:
        if any(not ch.isprintable() and ch not in "\n\t" for ch in v):
            raise ValueError("holds control characters")
        return v

    @model_validator(mode="after")
    def _idle_order(self) -> AgentProfile:
        if self.idle_hard_s < self.idle_no_voice_s:
            raise ValueError("idle_hard_s must be >= idle_no_voice_s")
        return self

    def system_prompt(self) -> str:
        """What the LLM is told: the role prompt, and the language to reply in when one is set."""
        if not self.language:
            return self.role_prompt
        line = f"Always reply in {self.language}."
        return f"{self.role_prompt}\n\n{line}" if self.role_prompt else line

    def public(self) -> dict[str, Any]:
        """As the management API shows it: the key masked."""
        data = self.model_dump(mode="json")
        data["llm"]["api_key"] = masked_key(self.llm.api_key)
        return data

    def __repr__(self) -> str:  # the key never reaches a log through a repr
        return f"AgentProfile(name={self.name!r}, voice={self.voice!r}, model={self.llm.model!r})"


def masked_key(key: str) -> str:
    """A key as shown back: references as written, a key as ``****`` and its last four characters."""
    if key in ("", KEY_CONFIG) or key.startswith(KEY_ENV):
        return key
    return MASK + key[-4:] if len(key) >= 12 else MASK


def keep_masked_key(new: str, old: str) -> str:
    """``new`` as it is to be stored: a masked form of ``old`` sent back unchanged keeps ``old``."""
    return old if new.startswith(MASK) and new == masked_key(old) else new


def resolve_key(key: str, config_key: str) -> str:
    """The key itself: ``config`` -> the config's, ``env:NAME`` -> the environment's ("" when unset)."""
    if key == KEY_CONFIG:
        return config_key
    if key.startswith(KEY_ENV):
        return os.environ.get(key[len(KEY_ENV) :], "")
    return key


def default_profile(config: Config) -> AgentProfile:
    """The agent of a config without agents: today's keys (llm, session, tts, tools, vision).

    Built without the API's bounds (``model_construct``): the config was validated by its own rules."""
    llm, session = config.llm, config.session
    return AgentProfile.model_construct(
        name=DEFAULT_AGENT,
        description="from the config file",
        role_prompt=llm.system_prompt,
        greeting=session.greeting or "你好",
        voice=config.tts.voice or "",
        speed=1.0,
        instruct="",
        llm=AgentLLM.model_construct(
            provider=llm.provider,
            base_url=llm.base_url,
            model=llm.model,
            api_key=KEY_CONFIG,
            temperature=None,
        ),
        language="",
        tools=AgentTools.model_construct(
            device=True,
            mcp_servers=None,
            builtins=[n for n in BUILTIN_TOOL_NAMES if n in config.tools.builtins],
        ),
        memory=session.memory == "local",
        memory_summary_chars=session.memory_summary_max_chars,
        idle_no_voice_s=session.idle_no_voice_s,
        idle_hard_s=session.idle_hard_s,
        expressive=False,
        vision_model="",
    )
