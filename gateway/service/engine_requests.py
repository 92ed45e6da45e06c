"""The one place the service asks the engine for speech, with a priority class.

The engine's scheduler ranks requests by class (issue 26 item 5: ``SpeechEngine.synthesize(...,
priority="device"|"interactive"|"batch")``): device turns first, API streams next, batch items only in the
capacity the others leave free. That argument is built on another branch; ``ENGINE_TAKES_PRIORITY`` reads
the engine interface itself, so once ``priority`` is part of ``SpeechEngine.synthesize`` every request made
here carries its class, with no change here. Until then the class is dropped (batch items then compete
with device turns as equals: docs/service.md says what that costs).
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

from tts_engine.interface import SpeechEngine, SpeechStream

__all__ = ["ENGINE_TAKES_PRIORITY", "Priority", "synthesize", "synthesize_zero_shot"]

Priority = Literal["device", "interactive", "batch"]

ENGINE_TAKES_PRIORITY = "priority" in inspect.signature(SpeechEngine.synthesize).parameters


def _priority(priority: Priority) -> dict[str, Any]:
    return {"priority": priority} if ENGINE_TAKES_PRIORITY else {}


def synthesize(
    engine: SpeechEngine,
    text: str,
    *,
    priority: Priority,
    voice: str | None,
    output_rate: int,
    speed: float = 1.0,
    instruct: str | None = None,
) -> SpeechStream:
    return engine.synthesize(text, voice=voice, output_rate=output_rate, speed=speed, instruct=instruct,
                             **_priority(priority))  # fmt: skip


def synthesize_zero_shot(
    engine: SpeechEngine,
    text: str,
    *,
    priority: Priority,
    prompt_wav: bytes,
    prompt_text: str,
    output_rate: int,
    speed: float = 1.0,
    instruct: str | None = None,
) -> SpeechStream:
    return engine.synthesize_zero_shot(text, prompt_wav=prompt_wav, prompt_text=prompt_text,
                                       output_rate=output_rate, speed=speed, instruct=instruct,
                                       **_priority(priority))  # fmt: skip
