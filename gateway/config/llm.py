"""The reply's sections: the LLM, the tools it may call (built-ins, MCP servers) and the segmenter."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.config.base import Section


class LLMConfig(Section):
    provider: Literal["echo", "openai"] = "echo"
    base_url: str = "https://api.openai.com/v1"
    api_key: str = ""
    model: str = "gpt-4o-mini"
    system_prompt: str = ""
    timeout_s: float = Field(30, gt=0)
    first_token_timeout_s: float = Field(15, gt=0)
    max_history_turns: int = Field(20, ge=0)
    apology: str = "抱歉，我现在有点问题，请稍后再试。"
    # function calling (provider openai, `tools` section): per call, rounds of calls per turn,
    # and the filler spoken when a round's calls take longer than tool_filler_after_s
    tool_timeout_s: float = Field(10, gt=0, le=300)
    max_tool_rounds: int = Field(3, ge=1, le=10)
    tool_filler_after_s: float = Field(1.5, ge=0, le=60)
    tool_filler: str = Field("稍等，我查一下。", max_length=200)


class MCPServerConfig(Section):
    """One server-side MCP server (docs/tools.md): a `command` run over stdio, or a streamable HTTP `url`."""

    command: str = ""  # stdio: the program to run, with args, extra env vars, working directory
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = ""
    url: str = ""  # streamable HTTP: the endpoint (http(s)://host/mcp), with extra request headers
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    enabled: bool = True
    call_timeout_s: float = Field(30, gt=0, le=600)  # one tools/call (and tools/list)

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("set exactly one of command (stdio) or url (streamable HTTP)")
        if self.url and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for a command; a url server takes headers")
        if self.command and self.headers:
            raise ValueError("headers are for a url server")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return self


BUILTIN_TOOL_NAMES = ("end_conversation", "change_voice", "get_time")  # gateway/tools/builtins.py


class ToolsConfig(Section):
    """Tools the LLM may call (docs/tools.md)."""

    enabled: bool = True  # offer tools to the LLM at all (provider openai)
    # the gateway's own tools (gateway/tools/builtins.py) offered in every session
    builtins: list[str] = Field(default_factory=lambda: list(BUILTIN_TOOL_NAMES))  # unknown: logged, ignored
    max_tools: int = Field(64, ge=1, le=128)  # offered per turn (OpenAI allows 128)
    max_argument_chars: int = Field(8192, ge=64, le=1_000_000)
    max_result_chars: int = Field(4000, ge=64, le=1_000_000)  # longer results are cut for the LLM

    # Server-side MCP servers by name, started once per process and shared by every session.
    mcp_servers: dict[str, MCPServerConfig] = Field(default_factory=dict)
    # How long start-up waits for the MCP servers to list their tools (the server starts anyway).
    mcp_start_timeout_s: float = Field(10, ge=0, le=600)


class SegmenterConfig(Section):
    first_segment_at_comma: bool = True
    max_chars: int = Field(120, ge=8, le=1000)

