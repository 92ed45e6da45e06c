"""Keeps credentials and oversized client strings out of the logs.

Browser clients and the incumbent's TTS providers put secrets in the URL (``?token=``,
``?authorization=Bearer%20...``, ``?api_key=``), and uvicorn logs every request line and every
WebSocket upgrade with its query string. :class:`RedactingFilter` rewrites those log records:
the value of every query parameter whose name looks like a credential becomes ``[redacted]``, and
a string argument is cut to :data:`MAX_ARG_CHARS` with control characters escaped.
:func:`loggable` does the same for our own log lines that quote client-supplied strings.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from typing import Any
from urllib.parse import unquote

REDACTED = "[redacted]"
MAX_ARG_CHARS = 512
# Normalised (lowercase, no "-" or "_") names that end like one of these are credentials.
_SECRET_SUFFIXES = ("token", "key", "secret", "password", "passwd", "pwd", "authorization", "auth",
                    "signature", "sig", "credential", "credentials", "bearer")  # fmt: skip
_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&;?#\s\"']{1,100})=(?P<value>[^&;#\s\"']*)")
UVICORN_LOGGERS = ("uvicorn.access", "uvicorn.error")


def _is_secret_name(name: str) -> bool:
    normal = unquote(name).lower().replace("-", "").replace("_", "")
    return normal.endswith(_SECRET_SUFFIXES)


def redact_query(text: str) -> str:
    """``text`` with the value of every credential-like ``name=value`` after ``?``/``&``/``;`` hidden."""
    if "=" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        if not _is_secret_name(match["name"]) or not match["value"]:
            return match[0]
        return f"{match['lead']}{match['name']}={REDACTED}"

    return _PARAM.sub(replace, text)


def loggable(value: object, limit: int = 64) -> str:
    """A client-supplied string made safe to log: control characters escaped, cut to ``limit``."""
    text = "" if value is None else str(value)
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    if any(unicodedata.category(ch)[0] == "C" for ch in text):
        text = "".join(repr(ch)[1:-1] if unicodedata.category(ch)[0] == "C" else ch for ch in text)
    return f"{text}...(+{cut} chars)" if cut > 0 else text


def _clean(arg: Any) -> Any:
    if isinstance(arg, str):
        return loggable(redact_query(arg), MAX_ARG_CHARS)
    return arg


class RedactingFilter(logging.Filter):
    """Rewrites a record's message and string arguments in place; never drops a record.

    The shape of ``args`` is kept (uvicorn's access formatter unpacks a 5-tuple).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_clean(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _clean(value) for key, value in record.args.items()}
        return True


def install_log_redaction(names: tuple[str, ...] = UVICORN_LOGGERS) -> None:
    """Adds one :class:`RedactingFilter` to each named logger (idempotent).

    Logger filters survive uvicorn's ``dictConfig`` (it replaces handlers, not filters).
    """
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
