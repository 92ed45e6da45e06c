"""The server's own sections: the device socket (`server`, its `auth`), OTA, audio and sessions."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from gateway.config.base import Section


class AuthConfig(Section):
    """Device socket admission (docs/device-auth.md)."""

    enabled: bool = False
    tokens: list[str] = Field(default_factory=list)  # operator tokens: never sent by OTA
    allowed_devices: list[str] = Field(default_factory=list)
    ota_open: bool = False  # OTA issues a device token to any Device-Id that asks
    secret: str = Field("", repr=False)  # signs device tokens; else secret_file; else random per process
    secret_file: str = ""  # read, or created with a random key, when `secret` is empty
    device_token_ttl_s: float = Field(30 * 86400, ge=60, le=366 * 86400)

    @field_validator("allowed_devices")
    @classmethod
    def _normalized_ids(cls, v: list[str]) -> list[str]:
        """MACs in the form devices are matched in (lower case, colons), whatever case they are listed in."""
        from gateway.xiaozhi.handshake import normalize_device_id

        return [normalize_device_id(item) or item for item in v]

    @field_validator("secret")
    @classmethod
    def _secret_length(cls, v: str) -> str:
        if v and len(v) < 16:
            raise ValueError("must be empty or at least 16 characters")
        return v


class ServerConfig(Section):
    host: str = "0.0.0.0"
    port: int = Field(8000, ge=0, le=65535)
    public_ws_url: str = ""
    # OTA derives the URL from X-Forwarded-Host/-Proto (set by a reverse proxy) instead of Host/scheme.
    trust_forwarded_headers: bool = False
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    auth: AuthConfig = Field(default_factory=AuthConfig)


class OtaConfig(Section):
    timezone_offset_minutes: int = Field(480, ge=-720, le=840)
    websocket_version: Literal[1, 2, 3] = 1
    activation: Literal["off", "code"] = "off"  # code: unknown devices activate by a code (`devices` section)

    @field_validator("activation", mode="before")
    @classmethod
    def _yaml_off(cls, v: object) -> object:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false


class AudioConfig(Section):
    output_sample_rate: Literal[16000, 24000] = 16000
    frame_ms: Literal[60] = 60
    opus_bitrate: int = Field(24000, ge=6000, le=128000)
    opus_complexity: int = Field(5, ge=0, le=10)
    prebuffer_frames: int = Field(5, ge=1, le=30)
    start_gap_ms: int = Field(120, ge=0, le=2000)
    stop_margin_ms: int = Field(420, ge=0, le=5000)
    max_utterance_s: float = Field(60, gt=0, le=600)


class SessionConfig(Section):
    idle_no_voice_s: float = Field(120, gt=0)
    idle_hard_s: float = Field(180, gt=0)
    wake_words: list[str] = Field(default_factory=list)
    enable_greeting: bool = True
    greeting: str = "你好，我在呢。"
    exit_commands: list[str] = Field(default_factory=list)
    max_text_frame_bytes: int = Field(65536, ge=256)
    max_binary_frame_bytes: int = Field(65551, ge=256)
    mcp_timeout_s: float = Field(30, gt=0, le=300)
    vision_url: str = Field("", max_length=2048)
    # per-device conversation memory (gateway/llm/memory.py): none, or local (kept in the store, store.url)
    memory: Literal["none", "local"] = "none"
    memory_path: str = "data/memory.sqlite3"  # the pre-store memory file, imported once; relative: project root
    memory_max_messages: int = Field(40, ge=4, le=10000)
    memory_summary_timeout_s: float = Field(20, gt=0, le=300)
    memory_summary_max_chars: int = Field(1000, ge=50, le=20000)

