"""API keys for the HTTP/WS API: who is calling (an ``Account``, gateway/service/accounts.py).

A request carries its key as ``Authorization: Bearer <key>`` or, for clients that cannot set headers (the
incumbent's ``index_stream`` provider posts to a bare URL), as the ``api_key`` query parameter. Keys come
from ``api.api_keys`` (admin accounts with no limits: the full access they always had) and from the store
(``python -m gateway keys add``). While no key exists anywhere (and ``service.require_keys`` is ``auto``)
every request passes as the ``anonymous`` account, with today's full access.

Plain HTTP requests are checked by ``gateway.security.http_guard`` before their body is read (that also
covers ``/metrics`` and the OpenAPI docs): it puts the request's account in ``scope["state"]``, where
``current_account`` finds it. ``require_api_key`` stays on the API routers as a second line;
``require_admin`` guards what only an admin may do (other keys' usage, other engineers' management APIs);
``/ws/tts`` checks its handshake with ``websocket_account``.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from fastapi import Request, WebSocket
from starlette.requests import HTTPConnection

from gateway.api.errors import ApiError
from gateway.service.accounts import ANONYMOUS, Account
from gateway.store import StoreError

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def presented_key(conn: HTTPConnection) -> str | None:
    """The key a request carries, if any."""
    header = conn.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return conn.query_params.get("api_key") or None


def missing_key() -> ApiError:
    return ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key",
                    headers=_CHALLENGE)  # fmt: skip


def invalid_key() -> ApiError:
    return ApiError(401, "invalid API key", code="invalid_api_key", headers=_CHALLENGE)


def key_error(conn: HTTPConnection, keys: Sequence[str]) -> ApiError | None:
    """The 401 for a request that does not carry one of ``keys``; None when it does or none are set."""
    if not keys:
        return None
    key = presented_key(conn)
    if key is None:
        return missing_key()
    # Compare with every key (no early exit) so timing does not tell which key is closest.
    matches = [hmac.compare_digest(key.encode(), k.encode()) for k in keys]
    return None if any(matches) else invalid_key()


async def account_of(conn: HTTPConnection) -> Account:
    """The account of a request's key (ApiError 401 without a valid one while keys are needed; the
    store's errors when only it could tell)."""
    accounts = conn.app.state.services.accounts
    key = presented_key(conn)
    required = await accounts.keys_required()
    if key is None:
        if required:
            raise missing_key()
        return ANONYMOUS
    if not required:
        # no key was known a moment ago: a key added since (by the CLI) counts at once; any other is
        # ignored, as before keys existed
        try:
            found = await accounts.authenticate(key)
        except StoreError:
            found = None
        return found or ANONYMOUS
    account = await accounts.authenticate(key)
    if account is None:
        raise invalid_key()
    return account


def current_account(conn: HTTPConnection) -> Account:
    """The request's account, as the HTTP guard found it (anonymous where no key was asked for)."""
    account = conn.scope.get("state", {}).get("account")
    return account if isinstance(account, Account) else ANONYMOUS


async def require_api_key(request: Request) -> None:
    """Route dependency: 401 unless the guard found the request's account (or no key is needed)."""
    if isinstance(request.scope.get("state", {}).get("account"), Account):
        return
    await account_of(request)  # the guard did not run (an app without it): the same check here


async def require_admin(request: Request) -> Account:
    """Route dependency: the request's account when it is an admin (config keys, ``keys add --admin``, and
    everyone while no key is needed); else 403 ``permission_denied``."""
    await require_api_key(request)
    account = current_account(request)
    if not account.admin:
        raise ApiError(403, f"key {account.name!r} is not an admin key; this needs one", code="permission_denied")
    return account


async def websocket_account(websocket: WebSocket) -> Account | None:
    """The handshake's account; None when it has no valid key while keys are needed."""
    try:
        return await account_of(websocket)
    except ApiError:
        return None
