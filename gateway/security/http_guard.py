"""Guards every plain HTTP request before the app sees it: the key and its account first, the account's
request rate, then a cap on the body; and meters what the request cost when its answer is over.

A pure ASGI middleware (Starlette's ``BaseHTTPMiddleware`` would buffer the body):

1. While keys are needed (``api.api_keys``, or keys in the store: gateway/api/auth.py), a protected path
   without a valid key gets 401 from its headers and query string alone: not one byte of its body is
   read. A valid key's account (gateway/service/accounts.py) goes into ``scope["state"]["account"]``,
   and its requests per second are checked (429, gateway/service/limits.py) still before the body. Its
   ``x-ratelimit-*`` headers go out with the answer; when the answer is over (however it ends) its usage
   is metered (requests, errors, characters, audio, first byte: gateway/service/served.py) and its
   stream slot released.
2. The body is counted while it streams, chunked or with a ``Content-Length``; a declared length over
   the cap of the path's family is refused before any byte is read, and a streamed one as soon as it
   passes the cap (413), without reading further. Multipart uploads stop there too (Starlette closes
   the temporary files of a form whose parsing fails).

Before either answer the rest of the body is read and dropped only while it stays within
``DRAIN_BYTES`` (1 MiB, within ``DRAIN_SECONDS``), so that clients that send a whole body before they
read (httpx's async client, the OpenAI SDK) hear the answer on a connection that stays open. A longer
body is not read on: the answer goes out with ``Connection: close`` and the connection is dropped. So
a refused request costs the server at most its cap plus 1 MiB, never the whole body. Errors have the
API's JSON shape (``gateway/api/errors.py``).

Families and their caps:

- OTA and device paths (``/xiaozhi/...``): ``api.max_ota_body_bytes``; never an API key (devices
  have their own token, ``server.auth``).
- The camera's photo (``/mcp/vision/explain``): ``vision.max_image_bytes`` plus 64 KiB; never an API key
  (the route checks the device's vision token before it reads the body, gateway/api/vision.py).
- Uploads (``/v1/voices`` and ``/v1/audio/voices``, ``/tts/zero_shot``): the text cap plus ``api.max_prompt_bytes``.
- Batch uploads (``POST /v1/audio/batches``): ``batches.max_file_bytes``.
- Every other path: ``api.max_text_chars`` JSON-escaped (12 bytes a character) plus 64 KiB.

Public without a key: ``/v1/health``, ``/xiaozhi/...``, the web console's page and assets
(``/console``, ``/console/...``: static files; its API calls carry the key), ``/metrics`` with ``api.public_metrics``,
the docs (``/docs``, ``/redoc``, ``/openapi.json``) with ``api.public_docs``. Every other path needs
a key, unknown ones included. WebSocket handshakes pass untouched: ``/ws/tts`` checks keys itself,
the device socket its tokens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.auth import account_of, key_error
from gateway.api.errors import ApiError, api_error
from gateway.api.synthesis import served_reporter
from gateway.config import ApiConfig
from gateway.service.limits import RateLimited
from gateway.service.served import Served
from gateway.store import StoreError

if TYPE_CHECKING:
    from gateway.services import Services

DEVICE_PREFIX = "/xiaozhi/"  # OTA (POST/GET /xiaozhi/ota/, /xiaozhi/ota/activate) and the socket's GET
VISION_PATH = "/mcp/vision/explain"  # a device's photo, with its vision token (gateway/api/vision.py)
UPLOAD_PATHS = frozenset({"/v1/voices", "/v1/audio/voices", "/tts/zero_shot"})
BATCH_PATH = "/v1/audio/batches"  # a batch job's JSONL upload
HEALTH_PATH = "/v1/health"
CONSOLE_PATH = "/console"  # the web console's page and, under it, its static assets (gateway/console.py)
METRICS_PATH = "/metrics"
BODY_OVERHEAD = 64 * 1024  # fields besides the text, multipart boundaries
DRAIN_BYTES = 1 << 20  # the most of a refused body read (and dropped) so the client hears the answer
DRAIN_SECONDS = 2.0


def text_body_cap(api: ApiConfig) -> int:
    """The body cap of the JSON endpoints: the longest text, every character JSON-escaped."""
    return api.max_text_chars * 12 + BODY_OVERHEAD


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes its cap; an HTTPException so FastAPI passes it on."""

    def __init__(self, cap: int) -> None:
        super().__init__(413, f"request body over {cap} bytes")
        self.cap = cap


class HttpGuard:
    """The middleware; ``docs_paths`` are the app's OpenAPI and docs URLs."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api: ApiConfig,
        docs_paths: Iterable[str | None] = (),
        vision_max_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.app = app
        self.keys = tuple(api.api_keys)
        public = {HEALTH_PATH}
        if api.public_metrics:
            public.add(METRICS_PATH)
        if api.public_docs:
            public.update(p for p in docs_paths if p)
        self.public = frozenset(public)
        self.text_cap = text_body_cap(api)
        self.upload_cap = self.text_cap + api.max_prompt_bytes
        self.ota_cap = api.max_ota_body_bytes
        self.vision_cap = vision_max_bytes + BODY_OVERHEAD

    def protected(self, path: str) -> bool:
        """Whether ``path`` needs a key (while keys are needed at all); the vision path has the device's
        own token instead (gateway/api/vision.py)."""
        if path in self.public or path.startswith(DEVICE_PREFIX) or path == VISION_PATH:
            return False
        return not (path == CONSOLE_PATH or path.startswith(CONSOLE_PATH + "/"))

    def needs_key(self, path: str) -> bool:
        """With the configured keys alone (an app whose services are not up)."""
        return bool(self.keys) and self.protected(path)

    def body_cap(self, path: str, services: Services | None = None) -> int:
        if path.startswith(DEVICE_PREFIX):
            return self.ota_cap
        if path == VISION_PATH:
            return self.vision_cap
        if path == BATCH_PATH and services is not None:
            return max(self.text_cap, services.config.batches.max_file_bytes)
        return self.upload_cap if path in UPLOAD_PATHS else self.text_cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _route_path(scope)
        headers = Headers(scope=scope)
        served: Served | None = None
        services = _services(scope)
        if services is None:
            if self.needs_key(path):
                error = key_error(HTTPConnection(scope), self.keys)
                if error is not None:
                    await _refuse(error, scope, receive, send, drain=_declared(headers) <= DRAIN_BYTES)
                    return
        elif self.protected(path):
            try:
                account = await account_of(HTTPConnection(scope))
            except (ApiError, StoreError) as exc:
                error = api_error(exc)
                services.metrics.observe_api(None, ok=False)
                await _refuse(error, scope, receive, send, drain=_declared(headers) <= DRAIN_BYTES)
                return
            state = scope.setdefault("state", {})
            state["account"] = account
            served = state["served"] = Served(account)
            try:
                services.limiter.admit_request(account)
            except RateLimited as exc:
                served.status = exc.status
                served.finish(served_reporter(services, limited=exc.kind))
                await _refuse(api_error(exc), scope, receive, send, drain=_declared(headers) <= DRAIN_BYTES)
                return
        cap = self.body_cap(path, services)
        declared = _declared(headers)
        if declared > cap:
            error = _too_large(cap, f"{declared} bytes")
            if served is not None and services is not None:
                served.status = 413
                served.finish(served_reporter(services))
            await _refuse(error, scope, receive, send, drain=declared <= DRAIN_BYTES)
            return
        if served is None or services is None:
            await _CappedBody(self.app, cap)(scope, receive, send)
            return
        try:
            await _CappedBody(self.app, cap)(scope, receive, _metered_send(send, served, services))
        finally:
            served.finish(served_reporter(services))


def _services(scope: Scope) -> Services | None:
    app = scope.get("app")
    return getattr(getattr(app, "state", None), "services", None)


def _metered_send(send: Send, served: Served, services: Services) -> Send:
    """``send`` that notes the status and first body byte, and adds the account's x-ratelimit headers."""

    async def metered(message: Message) -> None:
        if message["type"] == "http.response.start":
            served.status = message["status"]
            limits = services.limiter.headers(served.account)
            if limits:
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k.encode(), v.encode()) for k, v in limits.items() if k.encode() not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
        elif message["type"] == "http.response.body" and served.first_byte_at is None and message.get("body"):
            served.first_byte_at = time.monotonic()
        await send(message)

    return metered




class _CappedBody:
    """One request: ``receive`` raises ``BodyTooLarge`` past the cap; whatever the app answers then
    (FastAPI's own 413, a 400 of a failed parse, or an exception) becomes the API's 413."""

    def __init__(self, app: ASGIApp, cap: int) -> None:
        self.app = app
        self.cap = cap
        self.received = 0
        self.exceeded = False
        self.started = False  # the app's response went out
        self.replaced = False  # our 413 went out instead

    def _error(self) -> ApiError:
        return _streamed_too_large(self.cap)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def capped_receive() -> Message:
            if self.exceeded:
                raise BodyTooLarge(self.cap)
            message = await receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                if self.received > self.cap:
                    self.exceeded = True
                    raise BodyTooLarge(self.cap)
            return message

        async def guarded_send(message: Message) -> None:
            if self.replaced:
                return
            if self.exceeded and not self.started:
                self.replaced = True
                await _refuse(self._error(), scope, receive, send, drain=True)
                return
            if message["type"] == "http.response.start":
                self.started = True
            await send(message)

        try:
            await self.app(scope, capped_receive, guarded_send)
        except Exception:
            if not self.exceeded or self.started:
                raise
            if not self.replaced:
                self.replaced = True
                await _refuse(self._error(), scope, receive, send, drain=True)


def _streamed_too_large(cap: int) -> ApiError:
    """A body that passed ``cap`` while it streamed (its size is not known; no more of it is read)."""
    return ApiError(413, f"request body over {cap} bytes; the limit here is {cap} bytes", code="body_too_large")


def _too_large(cap: int, size: str) -> ApiError:
    return ApiError(413, f"request body of {size}; the limit here is {cap} bytes", code="body_too_large")


async def _refuse(error: ApiError, scope: Scope, receive: Receive, send: Send, *, drain: bool) -> None:
    """Send ``error``; with ``drain``, first drop what is left of the body if it ends within DRAIN_BYTES,
    else (or without ``drain``) leave it unread and close the connection."""
    response = error.response()
    if not (drain and await _dropped_rest(receive)):
        response.headers["connection"] = "close"
    await response(scope, receive, send)


async def _dropped_rest(receive: Receive) -> bool:
    """Read and drop the rest of the body: True when it ended within DRAIN_BYTES and DRAIN_SECONDS."""
    budget = DRAIN_BYTES
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            while budget >= 0:
                message = await receive()
                if message["type"] != "http.request":
                    return False  # the client is gone
                budget -= len(message.get("body", b""))
                if not message.get("more_body", False):
                    return budget >= 0
    except TimeoutError:
        return False
    return False


def _declared(headers: Headers) -> int:
    """The declared Content-Length; 0 without one (a chunked body is counted as it streams)."""
    declared = headers.get("content-length", "")
    return int(declared) if declared.isdigit() else 0


def _route_path(scope: Scope) -> str:
    """The path as the router matches it (without the ``root_path`` a proxy mounts the app under)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
