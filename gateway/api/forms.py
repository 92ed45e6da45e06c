"""Multipart forms decoded strictly: a text field that is not valid UTF-8 is a 400, not mojibake.

Starlette decodes a multipart text field with the request's charset and, where that fails, silently
with Latin-1 (``starlette.formparsers._user_safe_decode``), so a transcript of invalid UTF-8 would be
stored as mojibake. Starlette offers no strict mode and no hook for it, so ``StrictFormRequest`` parses
multipart bodies with ``StrictMultiPartParser``, which differs only in how a finished text part is
decoded; everything else (limits, files, the rest of the parse) is Starlette's.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from contextlib import aclosing
from typing import Any

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request, parse_options_header
from starlette.responses import Response

from gateway.api.errors import ApiError, ApiRoute


class StrictMultiPartParser(MultiPartParser):
    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                value = bytes(part.data).decode(self._charset or "utf-8")
            except (UnicodeDecodeError, LookupError) as exc:
                raise invalid_encoding(part.field_name, self._charset, exc) from None
            self.items.append((part.field_name, value))
            return
        super().on_part_end()


def invalid_encoding(field: str, charset: str, exc: Exception) -> ApiError:
    where = f": byte 0x{exc.object[exc.start]:02x} at position {exc.start}" if isinstance(
        exc, UnicodeDecodeError) else ""  # fmt: skip
    return ApiError(
        400, f"{field} is not valid {charset or 'utf-8'}{where}", code="invalid_text", param=field
    )


class StrictFormRequest(Request):
    """A request whose multipart form is decoded by ``StrictMultiPartParser``."""

    async def _get_form(
        self,
        *,
        max_files: int | float = 1000,
        max_fields: int | float = 1000,
        max_part_size: int = 1024 * 1024,
    ) -> FormData:
        if self._form is None:
            content_type, _ = parse_options_header(self.headers.get("Content-Type"))
            if content_type == b"multipart/form-data":
                async with aclosing(self.stream()) as stream:
                    parser = StrictMultiPartParser(
                        self.headers, stream, max_files=max_files, max_fields=max_fields,
                        max_part_size=max_part_size,
                    )  # fmt: skip
                    try:
                        self._form = await parser.parse()
                    except MultiPartException as exc:
                        raise HTTPException(status_code=400, detail=exc.message) from exc
        return await super()._get_form(
            max_files=max_files, max_fields=max_fields, max_part_size=max_part_size
        )


class UploadRoute(ApiRoute):
    """A route that takes a prompt recording; ``gateway.security.http_guard`` gives its path the larger body cap
    (``api.max_prompt_bytes`` on top of the text cap). Its multipart text fields must be valid UTF-8
    (``gateway.api.forms``: 400 ``invalid_text``, not mojibake)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(StrictFormRequest(request.scope, request.receive, request._send))

        return handle
