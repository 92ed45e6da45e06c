"""Optional API keys on the HTTP API (config `api.api_keys`, env XZ_API__API_KEYS)."""

from __future__ import annotations

import httpx
import pytest

from gateway.config import load_config
from tests.api_helpers import fake
from tests.gateway_server import running_gateway

BODY = {"text": "你好"}


async def test_without_keys_every_request_passes():
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient() as client:
        reply = await client.post(f"{gw.url}/v1/tts", json=BODY, headers={"Authorization": "Bearer anything"})
    assert reply.status_code == 200


@pytest.mark.parametrize(
    ("headers", "query", "status", "code"),
    [
        ({}, "", 401, "missing_api_key"),
        ({"Authorization": "Bearer wrong"}, "", 401, "invalid_api_key"),
        ({"Authorization": "Basic azE6"}, "", 401, "missing_api_key"),
        ({"Authorization": "Bearer k2"}, "", 200, None),
        ({"Authorization": "bearer  k1"}, "", 200, None),
        ({}, "?api_key=k1", 200, None),
        ({}, "?api_key=nope", 401, "invalid_api_key"),
    ],
)
async def test_keys_are_checked_on_every_api_route(headers, query, status, code):
    async with running_gateway({"api": {"api_keys": ["k1", "k2"]}}, backend=fake()) as gw:
        async with httpx.AsyncClient() as client:
            replies = [
                await client.post(f"{gw.url}/v1/tts{query}", json=BODY, headers=headers),
                await client.post(f"{gw.url}/v1/audio/speech{query}", json={"input": "hi"}, headers=headers),
                await client.post(f"{gw.url}/tts{query}", json=BODY, headers=headers),
                await client.get(f"{gw.url}/v1/voices{query}", headers=headers),
            ]
            health = await client.get(f"{gw.url}/v1/health")
    assert [r.status_code for r in replies] == [status] * len(replies)
    if code:
        assert all(r.json()["error"]["code"] == code for r in replies)
        assert all(r.headers["www-authenticate"] == "Bearer" for r in replies)
    assert health.status_code == 200  # probes need no key


def test_keys_from_the_environment_as_a_comma_separated_list():
    config = load_config(environ={"XZ_API__API_KEYS": "k1, k2,,"})
    assert config.api.api_keys == ["k1", "k2"]
    assert load_config(environ={"XZ_API__API_KEYS": "[a, b]"}).api.api_keys == ["a", "b"]
    assert load_config(environ={}, overrides={"api": {"api_keys": []}}).api.api_keys == []
