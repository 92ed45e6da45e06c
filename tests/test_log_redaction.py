"""Credentials in query strings and oversized client strings never reach the logs."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import websockets

from gateway.security.log_redaction import REDACTED, RedactingFilter, loggable, redact_query

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/x?token=abc", f"/x?token={REDACTED}"),
        ("/x?device-id=aa&authorization=Bearer%20abc&v=1", f"/x?device-id=aa&authorization={REDACTED}&v=1"),
        ("/tts?api_key=k1", f"/tts?api_key={REDACTED}"),
        ("/tts?access_token=a&API-KEY=b&x-api-key=c", f"/tts?access_token={REDACTED}&API-KEY={REDACTED}&x-api-key={REDACTED}"),
        ("/tts?access%5Ftoken=a", f"/tts?access%5Ftoken={REDACTED}"),
        ('GET /ota/?secret=s3 HTTP/1.1', f'GET /ota/?secret={REDACTED} HTTP/1.1'),
        ("/x?device-id=aa&client-id=bb&version=3", "/x?device-id=aa&client-id=bb&version=3"),
        ("/x?token=", "/x?token="),
        ("no query at all", "no query at all"),
    ],
)  # fmt: skip
def test_redact_query(text, expected):
    assert redact_query(text) == expected


def test_loggable_bounds_and_escapes():
    assert loggable("aa:bb") == "aa:bb"
    assert loggable(None) == ""
    assert loggable("a\x00b\nc\x1b") == "a\\x00b\\nc\\x1b"
    cut = loggable("Z" * 6000)
    assert cut.startswith("Z" * 64) and cut.endswith("(+5936 chars)") and len(cut) < 100


def test_filter_keeps_the_access_log_shape():
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", "/tts?api_key=k1&d=" + "x" * 2000, "1.1", 200), None,
    )  # fmt: skip
    assert RedactingFilter().filter(record)
    client, method, path, version, status = record.args
    assert (client, method, version, status) == ("127.0.0.1:5", "GET", "1.1", 200)
    assert "k1" not in path and REDACTED in path and len(path) < 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served():
    """`python -m gateway serve` (fake TTS, auth on) in a subprocess; yields (base url, stderr reader)."""
    port = _free_port()
    env = {
        **os.environ,
        "XZ_TTS__BACKEND": "fake",
        "XZ_ASR__BACKEND": "none",
        "XZ_SERVER__AUTH__ENABLED": "true",
        "XZ_SERVER__AUTH__TOKENS": "[op-secret-123]",
        "XZ_SERVER__AUTH__SECRET": "s" * 32,
        "XZ_API__API_KEYS": "api-secret-456",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:  # wait for the port: the test, not the server, polls
        try:
            httpx.get(f"{base}/v1/health", timeout=1)
            break
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"server did not start:\n{proc.communicate()[0]}")
            time.sleep(0.2)

    def logs() -> str:
        proc.terminate()
        try:
            return proc.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.communicate()[0]

    try:
        yield base, logs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_served_logs_hold_no_credentials_no_long_ids_and_no_handshake_error(served):
    base, logs = served
    ws = base.replace("http", "ws", 1) + "/xiaozhi/v1/"
    async with httpx.AsyncClient() as client:
        await client.post(
            f"{base}/xiaozhi/ota/?token=leak-ota-1", json={}, headers={"User-Agent": "U" * 3000}
        )
        await client.post(f"{base}/tts?api_key=api-secret-456", json={"text": "hi"})
    async with websockets.connect(f"{ws}?device-id=aa&authorization=Bearer%20op-secret-123"):
        pass
    for query in ("?device-id=bb&authorization=Bearer%20leak-ws-2", "?device-id=" + "Z" * 6000):
        with pytest.raises(websockets.InvalidStatus):
            async with websockets.connect(ws + query):
                pass
    text = logs()
    assert "op-secret-123" not in text and "api-secret-456" not in text
    assert "leak-ota-1" not in text and "leak-ws-2" not in text
    assert REDACTED in text
    assert "ASGI callable returned without completing handshake" not in text
    assert "Z" * 600 not in text and "U" * 600 not in text
    assert max(len(line) for line in text.splitlines()) < 1200
