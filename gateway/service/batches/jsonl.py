"""A batch job's input: JSONL, one speech request per line, in either of two shapes.

    {"custom_id": "ch1-001", "input": "第一章。", "voice": "default", "response_format": "wav", "speed": 1.0}
    {"custom_id": "ch1-002", "method": "POST", "url": "/v1/audio/speech", "body": {"input": "...", ...}}

The second is OpenAI's batch line (its ``body`` is a ``/v1/audio/speech`` body). Fields: ``input``
(required), ``voice``, ``response_format`` (default ``mp3``, as ``/v1/audio/speech``), ``speed``,
``instructions``, ``sample_rate``; ``model`` and unknown fields are ignored. ``custom_id`` names the item
in the results (default ``line-<n>``) and must be unique within the job. Blank lines are skipped. The
whole file is read once, line by line: the work is linear in its size.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["BatchLine", "BatchInputError", "parse_jsonl"]

MAX_CUSTOM_ID = 256
MAX_ERRORS = 20  # problems listed in one answer


@dataclass(frozen=True)
class BatchLine:
    line: int  # 1-based
    custom_id: str
    input: str
    voice: str | None
    response_format: str
    speed: float
    instructions: str | None
    sample_rate: int | None

    def request(self) -> dict[str, Any]:
        """What the store keeps of it (the voice and rate as resolved by the API)."""
        return {"input": self.input, "voice": self.voice, "response_format": self.response_format,
                "speed": self.speed, "instructions": self.instructions, "sample_rate": self.sample_rate}  # fmt: skip


class BatchInputError(ValueError):
    """The input has problems: ``problems`` lists them as ``line N: ...`` (at most MAX_ERRORS)."""

    def __init__(self, problems: list[str], more: int = 0) -> None:
        self.problems = problems
        self.more = more
        tail = f" (and {more} more)" if more else ""
        super().__init__("; ".join(problems) + tail)


def parse_jsonl(data: bytes, *, max_items: int) -> list[BatchLine]:
    """The lines of ``data`` as requests; ``BatchInputError`` listing every problem found (up to
    MAX_ERRORS): not UTF-8, not a JSON object, a field of the wrong type, a duplicate custom_id, too many
    lines, no line at all."""
    problems: list[str] = []
    more = 0

    def problem(text: str) -> None:
        nonlocal more
        if len(problems) < MAX_ERRORS:
            problems.append(text)
        else:
            more += 1

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BatchInputError([f"the file is not UTF-8 (byte {exc.start})"]) from None
    lines: list[BatchLine] = []
    seen: set[str] = set()
    count = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        count += 1
        if count > max_items:
            raise BatchInputError([f"more than {max_items} requests (batches.max_items)"])
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            problem(f"line {number}: not JSON ({exc.msg})")
            continue
        try:
            line = _line(number, obj)
        except ValueError as exc:
            problem(f"line {number}: {exc}")
            continue
        if line.custom_id in seen:
            problem(f"line {number}: custom_id {line.custom_id!r} is used twice")
            continue
        seen.add(line.custom_id)
        lines.append(line)
    if problems:
        raise BatchInputError(problems, more)
    if not lines:
        raise BatchInputError(["no request in the file (one JSON object per line)"])
    return lines


def _line(number: int, obj: Any) -> BatchLine:
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    custom_id = obj.get("custom_id", f"line-{number}")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        raise ValueError(f"custom_id must be a string of 1..{MAX_CUSTOM_ID} characters")
    body = obj.get("body", obj)
    if "body" in obj:
        url = obj.get("url", "/v1/audio/speech")
        if url != "/v1/audio/speech":
            raise ValueError(f"url {str(url)[:80]!r}: only /v1/audio/speech requests can be batched")
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
    text = body.get("input")
    if not isinstance(text, str):
        raise ValueError("input (the text) must be a string")
    voice = body.get("voice")
    if isinstance(voice, dict):
        voice = voice.get("id")
    if voice is not None and not isinstance(voice, str):
        raise ValueError("voice must be a string or {\"id\": name}")
    fmt = body.get("response_format", "mp3")
    if not isinstance(fmt, str):
        raise ValueError("response_format must be a string")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not math.isfinite(speed):
        raise ValueError("speed must be a number")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError("instructions must be a string")
    rate = body.get("sample_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int)):
        raise ValueError("sample_rate must be an integer")
    return BatchLine(number, custom_id, text, voice, fmt, float(speed), instructions or None, rate)
