"""Explaining a device's photo: its agent's vision model, asked through an OpenAI-compatible chat with an
image part (the firmware's camera tool posts to the URL MCP ``initialize`` gave it; gateway/api/vision.py).

A device is told our URL and a vision token bound to its Device-Id (``capability``), never its socket
token. Tokens are signed with a key derived from the device-token key (``server.auth``), else a random
key per process (a device asks the gateway that holds its session, which nginx routes by Device-Id).
The model: the agent's ``vision_model`` on the agent's own LLM endpoint and key, else ``vision.model``
on the vision section's endpoint (``vision.base_url``/``api_key``, empty: the ``llm`` section's).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets

from gateway.agents.profile import AgentProfile, resolve_key
from gateway.config import Config
from gateway.device.mcp_client import VisionCapability
from gateway.llm.base import LLMError
from gateway.llm.openai_chat import OpenAIChatLLM
from gateway.security.device_tokens import DeviceTokenSigner, load_secret

__all__ = ["VISION_PATH", "VisionError", "VisionService", "image_type"]

VISION_PATH = "/mcp/vision/explain"
TOKEN_TTL_S = 86400.0
_TOKEN_PURPOSE = b"xiaozhi-gateway vision token v1"

# magic bytes of the image types a vision model takes
_MAGIC = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
)


class VisionError(Exception):
    """The vision model could not answer (HTTP error, timeout, empty answer)."""


def image_type(data: bytes) -> str | None:
    """The image's MIME type from its first bytes (JPEG, PNG, WebP); None for anything else."""
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def vision_secret(config: Config) -> bytes:
    """The key of vision tokens: derived from the device-token key when one is configured, else random."""
    auth = config.server.auth
    if auth.enabled and (auth.secret or auth.secret_file):
        secret, _ = load_secret(auth)
        return hmac.new(secret, _TOKEN_PURPOSE, hashlib.sha256).digest()
    return secrets.token_bytes(32)


class VisionService:
    def __init__(self, config: Config, secret: bytes | None = None) -> None:
        self.config = config
        self.signer = DeviceTokenSigner(secret or vision_secret(config), TOKEN_TTL_S)

    def enabled_for(self, profile: AgentProfile) -> bool:
        return bool(profile.vision_model or self.config.vision.model)

    def capability(self, device_id: str, origin: str | None) -> VisionCapability:
        """Our URL and a token for ``device_id`` (no URL to give without an origin or vision.public_url)."""
        url = self.config.vision.public_url or (origin.rstrip("/") + VISION_PATH if origin else "")
        if not url:
            return VisionCapability()
        return VisionCapability(url=url, token=self.signer.issue(device_id))

    def verify(self, token: str | None, device_id: str | None) -> bool:
        return bool(token) and self.signer.verify(token or "", device_id)

    async def explain(self, profile: AgentProfile, image: bytes, mime: str, question: str) -> str:
        """The model's answer to ``question`` about ``image`` (within ``vision.timeout_s``)."""
        cfg, llm_cfg = self.config.vision, self.config.llm
        if profile.vision_model:
            base_url, model = profile.llm.base_url, profile.vision_model
            key = resolve_key(profile.llm.api_key, llm_cfg.api_key)
        else:
            base_url, model = cfg.base_url or llm_cfg.base_url, cfg.model
            key = cfg.api_key or llm_cfg.api_key
        if not model:
            raise VisionError("no vision model is configured")
        text = question.strip() or "请描述这张图片。"
        if profile.language:
            text += f"\n(Answer in {profile.language}.)"
        image_url = f"data:{mime};base64,{base64.b64encode(image).decode('ascii')}"
        messages = [{"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": image_url}},
        ]}]  # fmt: skip
        parts: list[str] = []
        llm = OpenAIChatLLM(
            base_url=base_url, api_key=key or None, model=model, timeout_s=cfg.timeout_s,
            first_token_timeout_s=cfg.timeout_s, max_tokens=cfg.max_answer_tokens,
        )  # fmt: skip
        try:
            async with asyncio.timeout(cfg.timeout_s):
                async for item in llm.stream_round(messages, []):
                    if isinstance(item, str):
                        parts.append(item)
        except TimeoutError:
            raise VisionError(f"the vision model gave no whole answer within {cfg.timeout_s:g} s") from None
        except LLMError as exc:
            raise VisionError(str(exc)) from None
        finally:
            await llm.aclose()
        answer = "".join(parts).strip()
        if not answer:
            raise VisionError("the vision model answered nothing")
        return answer
