"""Checks of ``TTSEngine.synthesize()`` arguments (typed errors, raised on the caller's side)."""

from __future__ import annotations

SUPPORTED_SAMPLE_RATES = (8000, 12000, 16000, 22050, 24000, 44100, 48000)
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


def check_encodable(value: str, name: str) -> None:
    """Raise ValueError when ``value`` holds a lone UTF-16 surrogate (tokenizers and espeak-ng need UTF-8)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} is not valid Unicode: lone surrogate U+{ord(value[exc.start]):04X} at position {exc.start}"
        ) from None


def check_arguments(text: str, sample_rate: int, speed: float) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    check_encodable(text, "text")
    if isinstance(sample_rate, bool) or sample_rate not in SUPPORTED_SAMPLE_RATES:
        raise ValueError(f"sample_rate must be one of {SUPPORTED_SAMPLE_RATES}, got {sample_rate!r}")
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed must be a number in [{MIN_SPEED}, {MAX_SPEED}], got {speed!r}")
