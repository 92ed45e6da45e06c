"""Fetch files of a Hugging Face or ModelScope model repository over plain HTTP: resumable and verified.

The file list comes from the hub's API (Hugging Face: ``/api/models/<repo>?blobs=true``, with sizes, the
LFS sha256 of large files and the git blob id of small ones; ModelScope:
``/api/v1/models/<repo>/repo/files?Recursive=true``, with sizes and sha256). Each file is fetched into
``<file>.part`` (hashed as it arrives), resumed with an HTTP Range request after an interruption, checked
against the listing and only then renamed into place, so a file under its real name is always complete.
A file that fails its check is deleted, never renamed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol
from urllib.parse import quote

import httpx
from tqdm import tqdm

HUBS = {"modelscope": "ModelScope", "hf": "Hugging Face"}
DEFAULT_ENDPOINTS = {
    "modelscope": os.environ.get("MODELSCOPE_ENDPOINT", "https://modelscope.cn"),
    "hf": os.environ.get("HF_ENDPOINT", "https://huggingface.co"),
}
CHUNK = 1 << 20
RETRIES = 5
RETRY_DELAY_S = 1.0  # doubled after each failed attempt, at most 30 s


class DownloadError(RuntimeError):
    """A listing or a file could not be fetched or does not match what the hub announced."""


class LocalError(DownloadError):
    """The problem is on this machine (disk full, no permission): another hub would not help."""


class _Retry(Exception):
    """A transient failure (dropped connection, HTTP 5xx/429): try again, resuming."""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str  # relative POSIX path inside the repository
    url: str
    size: int | None = None
    sha256: str | None = None
    git_sha1: str | None = None  # git blob id (Hugging Face, for files not stored in LFS)


def human(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, like the hubs)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- listings --------------------------------------------------------------------------------------


def _safe_path(path: object) -> str:
    """A repository-relative path that cannot leave the destination folder."""
    if not isinstance(path, str) or not path:
        raise DownloadError(f"hub listing has a bad file path: {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or "\\" in path:
        raise DownloadError(f"hub listing has an unsafe file path: {path!r}")
    return str(pure)


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _optional_hex(value: object) -> str | None:
    return value.lower() if isinstance(value, str) and value else None


def _get_json(client: httpx.Client, url: str) -> object:
    try:
        response = client.get(url)
        response.raise_for_status()
        return response.json()
    except httpx.HTTPStatusError as exc:
        raise DownloadError(f"cannot list files at {url}: HTTP {exc.response.status_code}") from exc
    except (httpx.HTTPError, ValueError) as exc:
        raise DownloadError(f"cannot list files at {url}: {exc or type(exc).__name__}") from exc


def list_hf(client: httpx.Client, repo: str, *, endpoint: str) -> list[RemoteFile]:
    """Files of a Hugging Face model repository (main revision), with sizes, LFS sha256 and git blob ids."""
    endpoint = endpoint.rstrip("/")
    data = _get_json(client, f"{endpoint}/api/models/{repo}?blobs=true")
    siblings = data.get("siblings") if isinstance(data, dict) else None
    if not isinstance(siblings, list):
        raise DownloadError(f"{endpoint}: the model listing of {repo} has no 'siblings'")
    files = []
    for entry in siblings:
        if not isinstance(entry, dict):
            continue
        path = _safe_path(entry.get("rfilename"))
        lfs = entry.get("lfs") if isinstance(entry.get("lfs"), dict) else None
        sha = _optional_hex(lfs.get("sha256")) if lfs else None
        blob = None if lfs else _optional_hex(entry.get("blobId"))  # an LFS blob id is the pointer's
        url = f"{endpoint}/{repo}/resolve/main/{quote(path)}"
        files.append(RemoteFile(path, url, _optional_int(entry.get("size")), sha, blob))
    return files


def list_modelscope(
    client: httpx.Client, repo: str, *, endpoint: str, revision: str = "master"
) -> list[RemoteFile]:
    """Files of a ModelScope model repository, with sizes and sha256."""
    endpoint = endpoint.rstrip("/")
    data = _get_json(client, f"{endpoint}/api/v1/models/{repo}/repo/files?Revision={revision}&Recursive=true")
    payload = data.get("Data") if isinstance(data, dict) else None
    entries = payload.get("Files") if isinstance(payload, dict) else None
    if not isinstance(entries, list):
        raise DownloadError(f"{endpoint}: the file listing of {repo} has no Data.Files")
    files = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("Type") == "tree":
            continue
        path = _safe_path(entry.get("Path"))
        url = f"{endpoint}/api/v1/models/{repo}/repo?Revision={revision}&FilePath={quote(path, safe='')}"
        files.append(
            RemoteFile(path, url, _optional_int(entry.get("Size")), _optional_hex(entry.get("Sha256")))
        )
    return files


def list_repo(client: httpx.Client, hub: str, repo: str, *, endpoint: str | None = None) -> list[RemoteFile]:
    endpoint = endpoint or DEFAULT_ENDPOINTS[hub]
    if hub == "hf":
        return list_hf(client, repo, endpoint=endpoint)
    if hub == "modelscope":
        return list_modelscope(client, repo, endpoint=endpoint)
    raise ValueError(f"hub must be one of {', '.join(HUBS)}, got {hub!r}")


def select_files(
    files: Iterable[RemoteFile],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    last: str | None = None,
) -> list[RemoteFile]:
    """``include`` globs pick files (``exclude`` is then ignored); otherwise all but ``exclude``.
    Sorted by path, with ``last`` at the end."""
    if include:
        chosen = [f for f in files if any(fnmatch.fnmatch(f.path, p) for p in include)]
    else:
        chosen = [f for f in files if not any(fnmatch.fnmatch(f.path, p) for p in exclude)]
    return sorted(chosen, key=lambda f: (f.path == last, f.path))


# ---- checks --------------------------------------------------------------------------------------


class _Hashes:
    """The digests the listing lets us check, fed as the bytes arrive."""

    def __init__(self, remote: RemoteFile) -> None:
        self.sha256 = hashlib.sha256() if remote.sha256 else None
        self.git = None
        if remote.git_sha1 and remote.size is not None:
            self.git = hashlib.sha1(f"blob {remote.size}\0".encode(), usedforsecurity=False)

    @property
    def any(self) -> bool:
        return self.sha256 is not None or self.git is not None

    def update(self, block: bytes) -> None:
        if self.sha256 is not None:
            self.sha256.update(block)
        if self.git is not None:
            self.git.update(block)

    def update_from(self, path: Path) -> None:
        with path.open("rb") as handle:
            while block := handle.read(CHUNK):
                self.update(block)

    def problem(self, remote: RemoteFile) -> str | None:
        if self.sha256 is not None and (actual := self.sha256.hexdigest()) != remote.sha256:
            return f"sha256 {actual} differs from the hub's {remote.sha256}"
        if self.git is not None and (actual := self.git.hexdigest()) != remote.git_sha1:
            return f"git blob id {actual} differs from the hub's {remote.git_sha1}"
        return None


def file_problem(remote: RemoteFile, target: Path, *, verify: bool = False) -> str | None:
    """Why ``target`` is not the hub's file, or None. Only the size is compared unless ``verify``."""
    if not target.is_file():
        return "missing"
    size = target.stat().st_size
    if remote.size is not None and size != remote.size:
        return f"{size} bytes where the hub lists {remote.size}"
    hashes = _Hashes(remote)
    if verify and hashes.any:
        hashes.update_from(target)
        return hashes.problem(remote)
    return None if remote.size is not None else "its size is not listed"


def bytes_to_fetch(files: Iterable[RemoteFile], dest: Path) -> int:
    """What is left to download (files complete by size and partial downloads count as fetched)."""
    total = 0
    for remote in files:
        target = dest / remote.path
        if remote.size is None or file_problem(remote, target) is None:
            continue
        part = target.with_name(target.name + ".part")
        total += remote.size - (part.stat().st_size if part.is_file() else 0)
    return max(total, 0)


def check_free_space(files: Sequence[RemoteFile], dest: Path) -> None:
    needed = bytes_to_fetch(files, dest)
    existing = next(p for p in (dest, *dest.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if needed > free:
        raise LocalError(
            f"{human(needed)} left to download into {dest}, but only {human(free)} is free there"
        )


# ---- transfer --------------------------------------------------------------------------------------


class Progress(Protocol):
    def update(self, n: int) -> Any: ...

    def close(self) -> None: ...


ProgressFactory = Callable[[str, int | None, int], Progress]


def tqdm_progress(name: str, total: int | None, initial: int) -> Progress:
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, desc=name, leave=True)


def download_file(
    client: httpx.Client,
    remote: RemoteFile,
    dest: Path,
    *,
    progress: ProgressFactory = tqdm_progress,
    retries: int = RETRIES,
    verify: bool = False,
) -> Path:
    """Fetch one file into ``dest/<path>`` through ``<path>.part`` (resumed with Range); returns the path.

    A file already there is kept when its size matches (and, with ``verify``, its hash)."""
    target = dest / remote.path
    if target.is_file():
        problem = file_problem(remote, target, verify=verify)
        if problem is None:
            return target
        if verify:
            say(f"{remote.path}: {problem}; fetching it again")
    part = target.with_name(target.name + ".part")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        resumed = part.is_file() and part.stat().st_size > 0
        problem = _fetch_checked(client, remote, part, progress, retries)
        if problem and resumed:
            say(f"{remote.path}: {problem} after resuming an earlier partial download; starting it over")
            part.unlink(missing_ok=True)
            problem = _fetch_checked(client, remote, part, progress, retries)
        if problem:
            part.unlink(missing_ok=True)
            raise DownloadError(f"{remote.path}: {problem} (from {remote.url}); the file was not kept")
        os.replace(part, target)
    except OSError as exc:
        raise LocalError(f"{remote.path}: cannot write {part}: {exc.strerror or exc}") from exc
    return target


def _fetch_checked(
    client: httpx.Client, remote: RemoteFile, part: Path, progress: ProgressFactory, retries: int
) -> str | None:
    """Completes ``part`` (retrying transient failures); returns what is wrong with it, or None."""
    for attempt in range(retries + 1):
        try:
            hashes = _fetch_into(client, remote, part, progress)
            break
        except (httpx.TransportError, _Retry) as exc:
            if attempt == retries:
                raise DownloadError(f"{remote.path}: giving up after {retries + 1} attempts: {exc}") from exc
            say(f"{remote.path}: {exc or type(exc).__name__}; resuming")
            time.sleep(min(30.0, RETRY_DELAY_S * 2.0**attempt))
    size = part.stat().st_size
    if remote.size is not None and size != remote.size:
        return f"got {size} bytes, the hub announced {remote.size}"
    return hashes.problem(remote)


def _fetch_into(client: httpx.Client, remote: RemoteFile, part: Path, progress: ProgressFactory) -> _Hashes:
    """Appends the rest of the file to ``part``; returns the hashes of all of ``part``."""
    have = part.stat().st_size if part.is_file() else 0
    if remote.size is not None and have > remote.size:
        part.unlink()  # longer than the real file: it cannot be a prefix of it
        have = 0
    hashes = _Hashes(remote)
    if have:
        hashes.update_from(part)
    if remote.size is not None and have == remote.size:
        return hashes
    headers = {"Range": f"bytes={have}-"} if have else {}
    with client.stream("GET", remote.url, headers=headers) as response:
        status = response.status_code
        if status == 416:
            part.unlink()
            raise _Retry("the server refused to resume (HTTP 416)")
        if status >= 500 or status == 429:
            raise _Retry(f"HTTP {status}")
        if status not in (200, 206):
            raise DownloadError(f"{remote.path}: HTTP {status} from {remote.url}")
        content_range = response.headers.get("Content-Range")
        if status == 206 and content_range and not content_range.startswith(f"bytes {have}-"):
            part.unlink()
            raise _Retry(f"the server resumed at the wrong place ({content_range})")
        if status == 200 and have:
            have, hashes = 0, _Hashes(remote)  # the server ignored the Range: start over
        bar = progress(remote.path, remote.size, have)
        try:
            with part.open("ab" if have else "wb") as handle:
                for block in response.iter_bytes():  # written as it arrives: an interruption loses nothing
                    handle.write(block)
                    hashes.update(block)
                    bar.update(len(block))
        finally:
            bar.close()
    return hashes
