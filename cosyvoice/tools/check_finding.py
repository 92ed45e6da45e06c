"""What a model check reports: one :class:`Finding` per check, and the helpers that word it.

Shared by the file, checkpoint and ONNX checks (``model_check``, ``checkpoint_check``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OK, MISSING, FAILED, SKIPPED = "ok", "missing", "failed", "skipped"
NOT_A_RELEASE = "this is not a Fun-CosyVoice3-0.5B-2512 release"

# Published release sizes (bytes), for the message when a file is far too small.
RELEASE_SIZES = {
    "llm.pt": 2_020_000_000,
    "flow.pt": 1_330_000_000,
    "hift.pt": 83_000_000,
    "campplus.onnx": 28_300_000,
    "speech_tokenizer_v3.onnx": 969_451_503,
}
_MAX_LISTED = 3


@dataclass(frozen=True, slots=True)
class Finding:
    """One check: ``status`` is ok / missing / failed / skipped; ``hint`` says what to do (empty if ok)."""

    name: str
    status: str
    detail: str
    hint: str = ""
    file: str | None = None  # the file concerned, relative to the model directory

    @property
    def ok(self) -> bool:
        return self.status in (OK, SKIPPED)


def human_size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit in ("B", "KB") else f"{size:.3g} {unit}"
        size /= 1000
    return f"{size:.3g} GB"


def listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f" (+{len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else "")


def first_sentence(exc: BaseException, limit: int = 100) -> str:
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    sentence = text.splitlines()[0].split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= limit else sentence[: limit - 3] + "..."
