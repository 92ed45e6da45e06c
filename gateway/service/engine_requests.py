"""The one place the service asks the engine for speech, with a priority class.

The engine's scheduler ranks requests by class (``SpeechEngine.synthesize(..., priority=)``,
tts_engine/interface.py, docs/engine-workers.md): device turns first (``device``: the gateway's speaker
asks for it itself), API streams next (``interactive``, or ``batch`` for a key added with
``--priority batch``), and batch items (``batch``) only in the capacity the others leave free; a batch
item in flight when a device turn arrives yields at its next step.
"""

from __future__ import annotations

from tts_engine.interface import Priority, SpeechEngine, SpeechStream

__all__ = ["Priority", "synthesize", "synthesize_zero_shot"]


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
                             priority=priority)  # fmt: skip


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
                                       priority=priority)  # fmt: skip
