"""The WebSocket address OTA hands devices: configured, from Host, or from a trusted proxy's X-Forwarded-*."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from gateway.config import load_config
from gateway.device.ota import websocket_url


def request(headers: dict[str, str], scheme: str = "http") -> Request:
    return Request(
        {
            "type": "http",
            "method": "POST",
            "scheme": scheme,
            "path": "/xiaozhi/ota/",
            "query_string": b"",
            "server": ("10.0.0.5", 8000),
            "client": ("10.0.0.9", 40000),
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }
    )


PROXIED = {"host": "10.0.0.5:8000", "x-forwarded-host": "voice.example.com", "x-forwarded-proto": "https"}


def test_without_trust_the_forwarded_headers_are_ignored() -> None:
    config = load_config(environ={})
    assert websocket_url(config, request(PROXIED)) == "ws://10.0.0.5:8000/xiaozhi/v1/"


def test_a_trusted_proxy_names_the_public_host_and_tls() -> None:
    config = load_config(environ={"XZ_SERVER__TRUST_FORWARDED_HEADERS": "true"})
    assert websocket_url(config, request(PROXIED)) == "wss://voice.example.com/xiaozhi/v1/"
    # A chain of proxies: the first entry is the one the device talked to.
    chained = {**PROXIED, "x-forwarded-host": "edge.example.com:8443, inner:80", "x-forwarded-proto": "http"}
    assert websocket_url(config, request(chained)) == "ws://edge.example.com:8443/xiaozhi/v1/"
    # No forwarded headers (a direct request): Host and the request's own scheme.
    assert websocket_url(config, request({"host": "gw:8000"}, "https")) == "wss://gw:8000/xiaozhi/v1/"


def test_the_configured_public_url_wins_over_everything() -> None:
    config = load_config(
        environ={
            "XZ_SERVER__TRUST_FORWARDED_HEADERS": "true",
            "XZ_SERVER__PUBLIC_WS_URL": "wss://devices.example.com/xiaozhi/v1/",
        }
    )
    assert websocket_url(config, request(PROXIED)) == "wss://devices.example.com/xiaozhi/v1/"


@pytest.mark.parametrize("bad", ["evil.com/phish?x=", "a b", "host:99999999", "[::1"])
def test_a_malformed_host_falls_back_to_the_servers_own_address(bad: str) -> None:
    config = load_config(environ={"XZ_SERVER__TRUST_FORWARDED_HEADERS": "true"})
    url = websocket_url(config, request({"host": bad, "x-forwarded-host": bad}))
    assert url == "ws://10.0.0.5:8000/xiaozhi/v1/"
