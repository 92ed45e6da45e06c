"""The `vision` section: the camera's explain endpoint (`POST /mcp/vision/explain`, gateway/api/vision.py)."""

from __future__ import annotations

from pydantic import Field

from gateway.config.base import Section

HTTP_URL = r"^(https?://\S+)?$"  # empty, or http(s)://...


class VisionConfig(Section):
    # The vision-capable model (OpenAI-compatible chat with an image part) of agents that name none
    # themselves. Empty (and no agent naming one): the endpoint is off and devices get no vision URL.
    model: str = Field("", max_length=128)
    # Its endpoint and key; empty: llm.base_url and llm.api_key.
    base_url: str = Field("", max_length=512, pattern=HTTP_URL)
    api_key: str = Field("", repr=False, max_length=512)
    # One explanation, end to end (the model's whole answer).
    timeout_s: float = Field(30, gt=0, le=300)
    max_image_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=32 * 1024 * 1024)
    max_question_chars: int = Field(1000, ge=10, le=20000)
    # Answer length asked of the model (its max_tokens).
    max_answer_tokens: int = Field(512, ge=16, le=8192)
    # The URL devices are told in MCP initialize (http(s)://host[:port]/mcp/vision/explain). Empty: derived
    # from the device's own connection, as OTA derives the WebSocket URL (server.public_ws_url, else the
    # Host header; server.trust_forwarded_headers behind a proxy). session.vision_url, when set, wins
    # (a third-party endpoint: then no token is sent).
    public_url: str = Field("", max_length=2048, pattern=HTTP_URL)

