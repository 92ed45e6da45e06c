"""What a gateway hands the engine workers it starts, and what it leaves on disk (issue 23).

`python -m gateway serve` in subprocesses with secrets set (device-token secret, operator tokens, API
keys, the LLM key): the worker gets its settings on stdin and none of the secrets (not in a file, not on
its command line, not in its environment); run folders of gateways killed with SIGKILL, and a folder an
older version left with its config file, are removed when the next gateway starts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
SECRETS = {
    "XZ_SERVER__AUTH__SECRET": "device-token-signing-secret-0123",
    "XZ_SERVER__AUTH__TOKENS": "[operator-token-4567]",
    "XZ_API__API_KEYS": "api-key-89ab",
    "XZ_LLM__API_KEY": "llm-key-cdef",
}
NEEDLES = [b"device-token-signing-secret-0123", b"operator-token-4567", b"api-key-89ab", b"llm-key-cdef"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    def __init__(self, temp_dir: Path) -> None:
        self.port = _free_port()
        env = {**os.environ, **SECRETS, "TMPDIR": str(temp_dir), "XZ_TTS__BACKEND": "fake",
               "XZ_ASR__BACKEND": "none", "XZ_ENGINE__WORKERS": "1", "XZ_SERVER__AUTH__ENABLED": "true"}  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 90
        while True:  # the test, not the server, polls
            try:
                self.health = httpx.get(f"{self.url}/v1/health", timeout=2).json()
                break
            except httpx.TransportError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    pytest.fail("the gateway did not start")
                time.sleep(0.2)
        self.worker_pid = int(self.health["engine"]["workers"][0]["pid"])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        _wait_gone(self.worker_pid)  # its worker ends on its stdin's EOF

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _wait_gone(pid: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        status = (
            Path(f"/proc/{pid}/status").read_text(errors="replace") if Path(f"/proc/{pid}").exists() else ""
        )
        if "State:\tZ" in status or time.monotonic() > deadline:  # a zombie is gone for our purpose
            break
        time.sleep(0.05)
    assert time.monotonic() <= deadline, f"worker {pid} outlived its gateway"


def _files_with_secrets(folder: Path) -> list[Path]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_socket():
            data = path.read_bytes()
            if any(needle in data for needle in NEEDLES):
                found.append(path)
    return found


def _run_dirs(folder: Path) -> set[Path]:
    return set(folder.glob("xz-engine-*"))


def test_workers_get_no_secrets_and_dead_gateways_leave_no_folders(tmp_path: Path) -> None:
    old = tmp_path / "xz-engine-old12345"  # what an older version left after a SIGKILL
    old.mkdir(mode=0o700)
    (old / "config.json").write_text('{"api": {"api_keys": ["api-key-89ab"]}}')
    (old / "worker-0.sock").touch()  # nobody listens on it
    assert _files_with_secrets(tmp_path) == [old / "config.json"]

    dead: set[Path] = {old}
    for _ in range(3):
        gateway = Gateway(tmp_path)
        mine = _run_dirs(tmp_path)  # the dead gateways' folders went at this start
        assert len(mine) == 1 and f"xz-engine-{gateway.proc.pid}-" in next(iter(mine)).name
        assert not dead & mine
        assert _files_with_secrets(tmp_path) == []  # no file holds a secret
        cmdline = Path(f"/proc/{gateway.worker_pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{gateway.worker_pid}/environ").read_bytes()
        assert b"--config-stdin" in cmdline
        assert not any(needle in cmdline or needle in environ for needle in NEEDLES)
        gateway.kill()
        assert _run_dirs(tmp_path) == mine  # a SIGKILL leaves its folder (for the next start)
        dead = mine

    survivor = Gateway(tmp_path)
    assert not dead & _run_dirs(tmp_path)
    survivor.stop()
    assert _run_dirs(tmp_path) == set()  # a clean stop removes its own
