"""A real PostgreSQL server for the tests: Debian's `postgresql` package, `initdb` into a temporary folder,
a free loopback port, its unix socket in that folder, started and stopped here (never the system's cluster).

It runs as unprivileged as the machine allows: as the calling user, or, when the tests run as root, as a
dedicated user (the `postgres` account the Debian package creates, else `nobody`) that owns the folder.
`initdb` runs once per test session into a template folder; each server copies it (faster than `initdb`).
The superuser has a password and loopback TCP connections need it (scram-sha-256), so the tests use
credentials as production does.

Missing binaries fail the test with the install command: the suite never skips PostgreSQL.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest

SUPERUSER = "xz_admin"
PASSWORD = "pg-test-secret-Zq81"  # the tests look for it in logs: it must never appear there
START_TIMEOUT_S = 60  # pg_ctl -w waits at most this long (a loaded 2-core machine)


def postgres_bin_dir() -> Path:
    """The newest installed server's binaries (/usr/lib/postgresql/<version>/bin), or a test failure."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    pytest.fail("PostgreSQL is not installed: `apt-get install postgresql` (scripts/setup.sh installs it)")


def _run_as() -> pwd.struct_passwd | None:
    """The account the server runs as when we are root (postgres refuses to run as root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    pytest.fail("running as root, and neither a `postgres` nor a `nobody` account exists to run PostgreSQL")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _chown_tree(path: Path, user: pwd.struct_passwd | None) -> None:
    if user is None:
        return
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            os.lchown(name, user.pw_uid, user.pw_gid)


def _run(args: list[str], user: pwd.struct_passwd | None, cwd: Path, timeout: float) -> None:
    kwargs: dict = {}
    if user is not None:
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stdout}{done.stderr}")


def make_template(bin_dir: Path) -> Path:
    """`initdb` once into a temporary folder; servers copy it."""
    user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="xz-pg-template-"))
    _chown_tree(root, user)
    pwfile = root / "pw"
    pwfile.write_text(PASSWORD + "\n")
    _chown_tree(root, user)
    _run(
        [str(bin_dir / "initdb"), "-D", str(root / "data"), "-U", SUPERUSER, f"--pwfile={pwfile}",
         "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-instructions", "--no-sync"],
        user, root, timeout=180,
    )  # fmt: skip
    pwfile.unlink()
    return root / "data"


@dataclass
class PostgresServer:
    """One server on ``port``; its data, socket and log in ``root`` (removed by ``remove``)."""

    bin_dir: Path
    root: Path
    port: int
    user: pwd.struct_passwd | None
    frozen: bool = False
    databases: list[str] = field(default_factory=list)

    @classmethod
    def from_template(cls, bin_dir: Path, template: Path) -> PostgresServer:
        root = Path(tempfile.mkdtemp(prefix="xz-pg-"))
        shutil.copytree(template, root / "data")
        (root / "data").chmod(0o700)
        user = _run_as()
        _chown_tree(root, user)
        return cls(bin_dir=bin_dir, root=root, port=_free_port(), user=user)

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres", *, password: bool = True) -> str:
        secret = f":{quote(PASSWORD, safe='')}" if password else ""
        return f"postgresql://{SUPERUSER}{secret}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        _run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), "-l", str(self.log_path), "-o",
             options, "-w", "-t", str(START_TIMEOUT_S), "start"],
            self.user, self.root, timeout=START_TIMEOUT_S + 30,
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m fast` (sessions ended, clean) or `immediate` (as if the machine died)."""
        self.thaw()
        _run([str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), "-m", mode, "-w", "stop"],
             self.user, self.root, timeout=120)  # fmt: skip

    def _postmaster_pid(self) -> int:
        return int((self.root / "data" / "postmaster.pid").read_text().split()[0])

    def _processes(self) -> list[int]:
        """The postmaster and its children (each backend calls setsid(), so no process group holds them)."""
        master = int((self.root / "data" / "postmaster.pid").read_text().split()[0])
        pids = [master]
        for stat in glob.glob("/proc/[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == master:  # fields: state, ppid, ...
                    pids.append(int(Path(stat).parent.name))
        return pids

    def freeze(self) -> None:
        """SIGSTOP the server and its backends: the kernel still accepts connections and buffers requests,
        nothing answers: a hung database, not a refused one. The postmaster first, so it forks no more."""
        for pid in self._processes():
            os.kill(pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            for pid in self._processes():
                os.kill(pid, signal.SIGCONT)
            self.frozen = False

    def create_database(self, name: str) -> str:
        """A fresh database (its URL): each test gets its own."""
        _run([str(self.bin_dir / "psql"), "-h", str(self.root), "-p", str(self.port), "-U", SUPERUSER, "-d",
              "postgres", "-v", "ON_ERROR_STOP=1", "-qc", f'CREATE DATABASE "{name}"'],
             self.user, self.root, timeout=60)  # fmt: skip
        self.databases.append(name)
        return self.url(name)

    def psql(self, database: str, sql: str) -> str:
        """Runs ``sql`` through psql over the unix socket; its unaligned output."""
        args = [str(self.bin_dir / "psql"), "-h", str(self.root), "-p", str(self.port), "-U", SUPERUSER,
                "-d", database, "-v", "ON_ERROR_STOP=1", "-AtXqc", sql]  # fmt: skip
        kwargs: dict = {}
        if self.user is not None:
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        done = subprocess.run(args, cwd=self.root, capture_output=True, text=True, timeout=60, check=True,
                              **kwargs)  # fmt: skip
        return done.stdout.strip()

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            if (self.root / "data" / "postmaster.pid").exists():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server(bin_dir: Path, template: Path) -> Iterator[PostgresServer]:
    server = PostgresServer.from_template(bin_dir, template)
    try:
        server.start()
        yield server
    finally:
        server.remove()
