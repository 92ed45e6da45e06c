"""Small files of a model directory: a JSON object read with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_json_object"]


def read_json_object(path: Path, error: type[Exception]) -> dict[str, Any]:
    """The JSON object in ``path``; ``error`` (naming the file) when it is missing, not JSON or no object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise error(f"{path}: file not found") from exc
    except json.JSONDecodeError as exc:
        raise error(f"{path}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object")
    return data
