"""Probe how the server treats big request bodies: time, bytes it accepted, its CPU, the status.

    python scripts/probe_bodies.py                 # starts a server (fake TTS, API key 'probe-key')
    python scripts/probe_bodies.py --mb 50 --url http://127.0.0.1:8000 --key k1

Each probe streams a chunked body of ``--mb`` MiB (no Content-Length) and counts what the server
accepted before it answered (what the kernel's socket buffers took counts too: a few MiB on
loopback). With a server it started itself, the script also reports the server's CPU seconds per
probe and its peak RSS so far (VmHWM: it only grows, so a row shows the largest of it and those above).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CHUNK = b"a" * 65536


class Counted:
    """A chunked body of ``total`` bytes that counts how much of it the client could send."""

    def __init__(self, head: bytes, tail: bytes, total: int) -> None:
        self.head, self.tail, self.total, self.sent = head, tail, total, 0

    def __iter__(self) -> Iterator[bytes]:
        yield self.head
        self.sent = len(self.head)
        while self.sent < self.total:
            yield CHUNK
            self.sent += len(CHUNK)
        yield self.tail
        self.sent += len(self.tail)


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mib(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def probe(url: str, body: Counted, headers: dict[str, str], pid: int | None) -> str:
    cpu, start = _cpu_seconds(pid), time.monotonic()
    try:
        with httpx.Client(timeout=120) as client:
            status: int | str = client.post(url, content=body, headers=headers).status_code
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    seconds, cpu = time.monotonic() - start, _cpu_seconds(pid) - cpu
    sent = body.sent / 2**20
    return f"{status!s:>6} {seconds:6.2f} s {sent:6.1f} MiB sent  server CPU {cpu:5.2f} s  peak RSS {_peak_rss_mib(pid):5.0f} MiB"


def _start_server(key: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "XZ_API__API_KEYS": key, "XZ_TTS__BACKEND": "fake", "XZ_ASR__BACKEND": "none",
           "XZ_SERVER__LOG_LEVEL": "warning"}  # fmt: skip
    cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(cmd, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--key", default="probe-key", help="a valid API key of that server")
    parser.add_argument("--mb", type=int, default=200, help="MiB per body")
    args = parser.parse_args()
    server, url = (None, args.url.rstrip("/")) if args.url else _start_server(args.key)
    pid = server.pid if server else None
    total, key = args.mb * 2**20, {"Authorization": f"Bearer {args.key}"}
    json_type = {"content-type": "application/json"}
    multipart = {"content-type": "multipart/form-data; boundary=b"}
    part = b'--b\r\nContent-Disposition: form-data; name="prompt_wav"; filename="a.wav"\r\n\r\n'
    text, wav = (b'{"text": "', b'"}'), (part, b"\r\n--b--\r\n")
    probes = [
        ("JSON /v1/tts, no key", "/v1/tts", text, json_type),
        ("JSON /v1/tts, valid key", "/v1/tts", text, {**json_type, **key}),
        ("multipart /v1/voices, no key", "/v1/voices", wav, multipart),
        ("multipart /v1/voices, valid key", "/v1/voices", wav, {**multipart, **key}),
        ("OTA /xiaozhi/ota/", "/xiaozhi/ota/", (b'{"a": "', b'"}'), json_type),
    ]
    try:
        print(
            f"{args.mb} MiB chunked bodies against {url}; server peak RSS at start {_peak_rss_mib(pid):.0f} MiB"
        )
        for name, path, (head, tail), headers in probes:
            print(f"{name:34} {probe(url + path, Counted(head, tail, total), headers, pid)}")
    finally:
        if server:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
