"""The HTTP/WebSocket TTS API section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config.base import Section

OPENAI_VOICE_NAMES = (
    "alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer",
    "verse",
)  # fmt: skip


class ApiConfig(Section):
    """The HTTP/WebSocket TTS API (gateway/api)."""

    max_text_chars: int = Field(4096, ge=1, le=1_000_000)
    max_prompt_seconds: float = Field(30, ge=1, le=30)  # the voice store takes 1..30 s prompts
    max_prompt_bytes: int = Field(10 * 1024 * 1024, ge=1024, le=16 * 1024 * 1024)
    api_keys: list[str] = Field(default_factory=list)
    # With api_keys set, /metrics and the OpenAPI docs (/docs, /redoc, /openapi.json) need a key too,
    # unless made public on purpose here (gateway/security/http_guard.py).
    public_metrics: bool = False
    public_docs: bool = False
    # OTA request bodies (the device's JSON report; a few KiB): cap in bytes, 413 beyond it.
    max_ota_body_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    default_sample_rate: Literal[8000, 12000, 16000, 22050, 24000, 44100, 48000] = 24000
    voice_aliases: dict[str, str] = Field(default_factory=lambda: dict.fromkeys(OPENAI_VOICE_NAMES, ""))
    # An unknown voice on the HTTP speech endpoints: fallback (the default voice, logged once per
    # name; what the incumbent's providers and OpenAI clients need) or strict (400 unknown_voice).
    unknown_voice: Literal["fallback", "strict"] = "fallback"

