"""The HTTP guard (gateway/security/http_guard.py): API keys before any body is read, bodies capped as they stream.

Real clients against a real server on loopback. A big body is a generator that counts what the client
managed to send: that bounds what the server read (plus what the sockets' kernel buffers hold, a few
MiB on loopback). Big bodies go out with httpx's sync client (in a thread), which, like curl and
requests, reads the early answer once the server closes the connection; httpx's async client stops
reading while it writes, so it hears an early answer only when the server drops the rest of the body
(bodies up to 1 MiB, http_guard.DRAIN_BYTES).
"""

from __future__ import annotations

import asyncio
import gc
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.security.http_guard import text_body_cap
from tests.api_helpers import fake
from tests.gateway_server import running_gateway

MIB = 1 << 20
BIG = 64 * MIB  # far over every cap
READ_AT_MOST = 16 * MIB  # what a refused request may have cost: kernel buffers, not the body
KEYS = {"api": {"api_keys": ["k1", "k2"]}}
KEY = {"Authorization": "Bearer k1"}
JSON = {"content-type": "application/json"}
BOUNDARY = "guardtest"
MULTIPART = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


class CountedBody:
    """A chunked body of ``total`` bytes between ``head`` and ``tail``; ``sent`` is what got out."""

    def __init__(self, head: bytes, tail: bytes, total: int = BIG) -> None:
        self.head, self.tail, self.total, self.sent = head, tail, total, 0

    def __iter__(self) -> Iterator[bytes]:
        chunk = b"a" * 65536
        yield self.head
        self.sent = len(self.head)
        while self.sent < self.total:
            yield chunk
            self.sent += len(chunk)
        yield self.tail
        self.sent += len(self.tail)


def json_body(total: int = BIG) -> CountedBody:
    return CountedBody(b'{"text": "', b'"}', total)


def multipart_body(total: int = BIG) -> CountedBody:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\nalice\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="prompt_text"\r\n\r\nhi\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="prompt_wav"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    return CountedBody(head, f"\r\n--{BOUNDARY}--\r\n".encode(), total)


def temp_files_open() -> list[str]:
    """Files of this process (the server runs in a thread of it) in the temp dir or already unlinked."""
    gc.collect()
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(tempfile.gettempdir()) or target.endswith("(deleted)"):
            found.append(target)
    return found


async def post(url: str, body: CountedBody | bytes, headers: dict[str, str]) -> httpx.Response:
    def send() -> httpx.Response:
        with httpx.Client(timeout=60) as client:
            return client.post(url, content=body, headers=headers)

    return await asyncio.to_thread(send)


async def test_a_chunked_body_without_a_key_gets_401_unread():
    body = json_body()
    async with running_gateway(KEYS, backend=fake()) as gw, httpx.AsyncClient() as client:
        reply = await post(f"{gw.url}/v1/tts", body, JSON)
        after = await client.post(f"{gw.url}/v1/tts", json={"text": "hi"}, headers=KEY)
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "missing_api_key"
    assert reply.headers["www-authenticate"] == "Bearer"
    assert body.sent < READ_AT_MOST, f"the server took {body.sent / MIB:.1f} MiB before answering 401"
    assert after.status_code == 200  # the server is fine


async def test_a_chunked_body_over_the_cap_gets_413_with_a_key():
    body = json_body()
    async with running_gateway(KEYS, backend=fake()) as gw, httpx.AsyncClient() as client:
        reply = await post(f"{gw.url}/v1/audio/speech", body, {**JSON, **KEY})
        small = await client.post(f"{gw.url}/v1/tts", json={"text": "hi"}, headers=KEY)
    assert reply.status_code == 413
    error = reply.json()["error"]
    assert error["code"] == "body_too_large" and error["type"] == "invalid_request_error"
    cap = text_body_cap(gw.services.config.api)
    assert error["message"] == f"request body over {cap} bytes; the limit here is {cap} bytes"  # not "of more"
    assert body.sent < READ_AT_MOST, f"the server took {body.sent / MIB:.1f} MiB before answering 413"
    assert small.status_code == 200


async def test_a_chunked_body_under_the_cap_still_passes():
    body = json_body(total=20_000)
    async with running_gateway(KEYS, backend=fake()) as gw:
        reply = await post(f"{gw.url}/v1/tts", body, {**JSON, **KEY})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "text"  # over max_text_chars


@pytest.mark.parametrize(("headers", "status"), [({}, 401), (KEY, 413)])
async def test_an_async_client_hears_the_refusal_of_a_body_under_a_mebibyte(headers, status):
    body = {"text": "x" * 500_000}  # over the text cap, with a Content-Length
    async with running_gateway(KEYS, backend=fake()) as gw, httpx.AsyncClient() as client:
        refused = await client.post(f"{gw.url}/v1/tts", json=body, headers=headers)
        again = await client.post(f"{gw.url}/v1/tts", json={"text": "hi"}, headers=KEY)
    assert refused.status_code == status and refused.json()["error"]["message"]
    assert "close" not in refused.headers.get("connection", "")  # the connection stays usable
    assert again.status_code == 200


@pytest.mark.parametrize(("headers", "status"), [({}, 401), (KEY, 413)])
async def test_a_chunked_multipart_upload_over_the_cap_is_stopped(headers, status):
    before = temp_files_open()
    body = multipart_body()
    config = {**KEYS, "api": {**KEYS["api"], "max_prompt_bytes": 3 * MIB}}  # spooled to disk past 1 MiB
    async with running_gateway(config, backend=fake()) as gw, httpx.AsyncClient() as client:
        reply = await post(f"{gw.url}/v1/voices", body, {**MULTIPART, **headers})
        listed = await client.get(f"{gw.url}/v1/voices", headers=KEY)
    assert reply.status_code == status and "error" in reply.json()
    assert body.sent < READ_AT_MOST, f"the server took {body.sent / MIB:.1f} MiB before answering"
    assert listed.status_code == 200
    assert temp_files_open() == before  # the spooled part is closed


@pytest.mark.parametrize("chunked", [True, False])
async def test_ota_bodies_are_capped(chunked):
    mib = b'{"a": "' + b"x" * MIB + b'"}'
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient() as client:
        content = CountedBody(mib[:7], mib[-2:], len(mib)) if chunked else mib
        big = await post(f"{gw.url}/xiaozhi/ota/", content, JSON)
        normal = await client.post(f"{gw.url}/xiaozhi/ota/", json={"application": {"version": "1.0"}})
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    assert normal.status_code == 200 and normal.json()["websocket"]["url"]


DOCS = ["/metrics", "/docs", "/redoc", "/openapi.json"]


async def test_metrics_and_docs_need_a_key_when_keys_are_set():
    async with running_gateway(KEYS, backend=fake()) as gw, httpx.AsyncClient() as client:
        anonymous = [await client.get(gw.url + path) for path in DOCS]
        wrong = [await client.get(gw.url + path, headers={"Authorization": "Bearer nope"}) for path in DOCS]
        with_key = [await client.get(gw.url + path, headers=KEY) for path in DOCS]
        in_query = [await client.get(f"{gw.url}{path}?api_key=k2") for path in DOCS]
        health = await client.get(f"{gw.url}/v1/health")
        unknown = await client.get(f"{gw.url}/no/such/page")
    assert [r.status_code for r in anonymous] == [401] * len(DOCS)
    assert {r.json()["error"]["code"] for r in anonymous} == {"missing_api_key"}
    assert [r.status_code for r in wrong] == [401] * len(DOCS)
    assert {r.json()["error"]["code"] for r in wrong} == {"invalid_api_key"}
    assert [r.status_code for r in with_key] == [200] * len(DOCS)
    assert [r.status_code for r in in_query] == [200] * len(DOCS)
    assert "xz_sessions_active" in with_key[0].text  # the Prometheus metrics
    assert health.status_code == 200  # probes need no key
    assert unknown.status_code == 401  # every path but the public ones


@pytest.mark.parametrize(
    ("switches", "public"),
    [
        ({"public_metrics": True}, ["/metrics"]),
        ({"public_docs": True}, ["/docs", "/redoc", "/openapi.json"]),
        ({"public_metrics": True, "public_docs": True}, DOCS),
    ],
)
async def test_metrics_and_docs_can_be_made_public_on_purpose(switches, public):
    config = {"api": {**KEYS["api"], **switches}}
    async with running_gateway(config, backend=fake()) as gw, httpx.AsyncClient() as client:
        replies = {path: (await client.get(gw.url + path)).status_code for path in DOCS}
        speech = await client.post(f"{gw.url}/v1/tts", json={"text": "hi"})
    assert replies == {path: 200 if path in public else 401 for path in DOCS}
    assert speech.status_code == 401  # the API itself stays protected


async def test_without_keys_metrics_and_docs_are_open():
    async with running_gateway(backend=fake()) as gw, httpx.AsyncClient() as client:
        replies = [(await client.get(gw.url + path)).status_code for path in DOCS]
    assert replies == [200] * len(DOCS)
