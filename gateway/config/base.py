"""What every config section is: a pydantic model that forbids unknown keys, with one rule for list keys.

Every list-of-strings key (`server.auth.tokens`, `api.api_keys`, ...) follows one rule, wherever
the value comes from: a list, or one string of comma-separated entries (`XZ_API__API_KEYS=k1,k2`,
`XZ_SERVER__AUTH__TOKENS=tok-abc`). Entries are stripped and empty ones dropped.
"""

from __future__ import annotations

from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class ConfigError(Exception):
    """The configuration is unreadable or invalid."""


def is_text_list(annotation: Any) -> bool:
    return get_origin(annotation) is list and get_args(annotation) == (str,)


def is_text(annotation: Any) -> bool:
    """A plain string key (`str` or `str | None`), whose environment value is never parsed as YAML."""
    if annotation is str:
        return True
    args = get_args(annotation)
    return bool(args) and str in args and all(a in (str, type(None)) for a in args)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _text_list(cls, value: Any, info: ValidationInfo) -> Any:
        """A list-of-strings key takes a list or one comma-separated string; empty entries are dropped."""
        field = cls.model_fields.get(info.field_name or "")
        if field is None or not is_text_list(field.annotation):
            return value
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list):
            return value
        items = [str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in value]
        items = [v.strip() if isinstance(v, str) else v for v in items]
        return [v for v in items if v is not None and v != ""]
