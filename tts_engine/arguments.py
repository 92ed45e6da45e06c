"""Checks of ``TTSEngine.synthesize()`` arguments (typed errors, raised on the caller's side)."""

from __future__ import annotations

import uuid
from collections.abc import Container, Sequence

from tts_engine.errors import UnknownVoice
from tts_engine.interface import OUTPUT_RATES, PRIORITIES, Priority
from tts_engine.voices import VoiceError

MIN_SPEED, MAX_SPEED = 0.25, 4.0
MAX_INSTRUCT_CHARS = 500


def check_instruct(instruct: str | None) -> str | None:
    if instruct is None:
        return None
    if not isinstance(instruct, str):
        raise ValueError(f"instruct must be a string or None, got {type(instruct).__name__}")
    if len(instruct) > MAX_INSTRUCT_CHARS:
        raise ValueError(f"instruct is longer than {MAX_INSTRUCT_CHARS} characters")
    check_encodable(instruct, "instruct")
    return instruct.strip() or None


def check_priority(priority: object) -> Priority:
    """``priority`` if it is one of the engine's classes (``PRIORITIES``), else ValueError."""
    for known in PRIORITIES:
        if priority == known and isinstance(priority, str):
            return known
    raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")


def check_encodable(value: str, name: str) -> None:
    """Raise ValueError when ``value`` holds a lone UTF-16 surrogate (tokenizers and espeak-ng need UTF-8)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} is not valid Unicode: lone surrogate U+{ord(value[exc.start]):04X} at position {exc.start}"
        ) from None


def check_arguments(text: str, output_rate: int, speed: float) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    check_encodable(text, "text")
    if isinstance(output_rate, bool) or output_rate not in OUTPUT_RATES:
        raise ValueError(f"output_rate (the stream's sample_rate) must be one of {OUTPUT_RATES}, got {output_rate!r}")
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed must be a number in [{MIN_SPEED}, {MAX_SPEED}], got {speed!r}")


def check_text_length(text: str, max_text_chars: int | None) -> None:
    """ValueError when ``text`` is longer than the engine takes (the backend's ``max_text_chars``)."""
    if max_text_chars is not None and len(text) > max_text_chars:
        raise ValueError(f"text is {len(text)} characters, the limit is {max_text_chars}")


def resolve_voice(voice: str | None, default: str, voices: Sequence[str]) -> str:
    """``voice`` (``default`` when None), or UnknownVoice when the engine does not offer it."""
    voice = default if voice is None else voice
    if voice not in voices:
        raise UnknownVoice(voice, list(voices))
    return voice


def check_zero_shot(backend_name: str, supports_cloning: bool, prompt_text: object) -> str:
    """The stripped transcript of a one-off prompt, or VoiceError when the backend cannot clone."""
    if not supports_cloning:
        raise VoiceError(f"backend {backend_name} cannot clone voices")
    if not isinstance(prompt_text, str):
        raise VoiceError(f"prompt_text must be a string, got {type(prompt_text).__name__}")
    return prompt_text.strip()


def check_req_id(req_id: str | None, open_ids: Container[str]) -> str:
    """``req_id``, or a fresh one when None; ValueError when empty, not a string, or already open."""
    if req_id is None:
        return uuid.uuid4().hex
    if not isinstance(req_id, str) or not req_id:
        raise ValueError(f"req_id must be a non-empty string, got {req_id!r}")
    if req_id in open_ids:
        raise ValueError(f"req_id {req_id!r} is already in use by an open stream")
    return req_id
