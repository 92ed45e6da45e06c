"""Download Fun-CosyVoice3-0.5B-2512 (and the default prompt voice) with plain HTTP.

    python scripts/download_model.py [--source auto|hf|modelscope] [--dest models/Fun-CosyVoice3-0.5B]
                                     [--include PATTERN ...] [--all] [--rl] [--verify] [--no-prompt]

The file list comes from the hub's API (Hugging Face: ``/api/models/<repo>?blobs=true``, sizes and LFS
sha256 per file; ModelScope: ``/api/v1/models/<repo>/repo/files?Recursive=true``, sizes and sha256).
Each file is fetched into ``<file>.part``, resumed with an HTTP Range request after an interruption,
checked (size, and sha256 when the hub gives it) and only then renamed into place, so a complete file
is never half-written. Files already complete (by size) are skipped; ``--verify`` also re-hashes them.
``cosyvoice3.yaml`` goes last: the gateway only uses a directory that has it.

By default only what our loader reads is fetched (about 6.4 GB): not the TensorRT-only estimator ONNX,
the batched tokenizer ONNX, BlankEN's unused ``model.safetensors``, ``llm.rl.pt`` (``--rl`` adds it) or
the hub's assets. ``--include`` selects files by glob instead; ``--all`` takes everything.

The default voice preset (``voices/default.yaml``) wants ``voices/default.wav``: the upstream example
prompt (CosyVoice's ``asset/zero_shot_prompt.wav``) is fetched there unless ``--no-prompt``. Without
it the gateway speaks the preset's transcript with espeak-ng and clones that (robotic, with a warning).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
DEFAULT_DEST = REPO_ROOT / "models" / "Fun-CosyVoice3-0.5B"
HF_ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
MODELSCOPE_ENDPOINT = os.environ.get("MODELSCOPE_ENDPOINT", "https://modelscope.cn")
PROMPT_URL = "https://raw.githubusercontent.com/FunAudioLLM/CosyVoice/main/asset/zero_shot_prompt.wav"
PROMPT_DEST = REPO_ROOT / "voices" / "default.wav"
DEFAULT_EXCLUDE = (
    "flow.decoder.estimator.fp32.onnx",  # TensorRT path only
    "speech_tokenizer_v3.batch.onnx",  # not used by the frontend
    "CosyVoice-BlankEN/model.safetensors",  # never read: llm.pt holds every LLM weight
    "llm.rl.pt",  # --rl
    "asset/*",
    ".gitattributes",
)
LAST_FILE = "cosyvoice3.yaml"
CHUNK = 1 << 20
RETRIES = 5


class DownloadError(RuntimeError):
    """A listing or a file could not be fetched or does not match what the hub announced."""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str  # relative POSIX path inside the repository
    url: str
    size: int | None = None
    sha256: str | None = None


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


def _get_json(client: httpx.Client, url: str) -> object:
    try:
        response = client.get(url)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise DownloadError(f"cannot list files at {url}: {exc}") from exc


def list_hf(client: httpx.Client, repo: str = REPO_ID, *, endpoint: str = HF_ENDPOINT) -> list[RemoteFile]:
    """Files of a Hugging Face model repository (main revision), with sizes and LFS sha256."""
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
        lfs = entry.get("lfs") if isinstance(entry.get("lfs"), dict) else {}
        sha = lfs.get("sha256") if isinstance(lfs.get("sha256"), str) else None
        size = _optional_int(entry.get("size"))
        url = f"{endpoint}/{repo}/resolve/main/{quote(path)}"
        files.append(RemoteFile(path, url, size, sha))
    return files


def list_modelscope(
    client: httpx.Client,
    repo: str = REPO_ID,
    *,
    endpoint: str = MODELSCOPE_ENDPOINT,
    revision: str = "master",
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
        sha = entry.get("Sha256") if isinstance(entry.get("Sha256"), str) and entry.get("Sha256") else None
        url = f"{endpoint}/api/v1/models/{repo}/repo?Revision={revision}&FilePath={quote(path, safe='')}"
        files.append(RemoteFile(path, url, _optional_int(entry.get("Size")), sha))
    return files


def select_files(
    files: Iterable[RemoteFile], *, include: Sequence[str] = (), exclude: Sequence[str] = DEFAULT_EXCLUDE
) -> list[RemoteFile]:
    """``include`` globs pick files (then ``exclude`` is ignored); otherwise all but ``exclude``.
    The config file comes last."""
    if include:
        chosen = [f for f in files if any(fnmatch.fnmatch(f.path, p) for p in include)]
    else:
        chosen = [f for f in files if not any(fnmatch.fnmatch(f.path, p) for p in exclude)]
    return sorted(chosen, key=lambda f: (f.path == LAST_FILE, f.path))


class _Progress:
    """tqdm when installed, else a plain line on stderr about once a second."""

    def __init__(self, name: str, total: int | None, initial: int) -> None:
        self.name, self.total, self.done = name, total, initial
        self._last = 0.0
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(total=total, initial=initial, unit="B", unit_scale=True, desc=name, leave=True)

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= 1.0:
            self._last = now
            total = f"/{self.total / 1e6:.1f}" if self.total else ""
            print(f"  {self.name}: {self.done / 1e6:.1f}{total} MB", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


ProgressFactory = Callable[[str, int | None, int], _Progress]


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def is_complete(remote: RemoteFile, target: Path, *, verify: bool = False) -> bool:
    if not target.is_file() or (remote.size is not None and target.stat().st_size != remote.size):
        return False
    if remote.size is None and not (verify and remote.sha256):
        return False  # nothing to compare with: fetch it again
    return not (verify and remote.sha256) or _sha256_of(target) == remote.sha256.lower()


def download_file(
    client: httpx.Client,
    remote: RemoteFile,
    dest: Path,
    *,
    progress: ProgressFactory = _Progress,
    retries: int = RETRIES,
    retry_delay_s: float = 1.0,
    verify: bool = False,
) -> Path:
    """Fetch one file into ``dest/<path>`` through ``<path>.part`` (resumed with Range); returns the path."""
    target = dest / remote.path
    if is_complete(remote, target, verify=verify):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    for attempt in range(retries + 1):
        try:
            _fetch_into(client, remote, part, progress)
            break
        except httpx.TransportError as exc:
            if attempt == retries:
                raise DownloadError(f"{remote.path}: giving up after {retries + 1} attempts: {exc}") from exc
            print(f"  {remote.path}: {exc!r}; resuming", file=sys.stderr)
            time.sleep(min(30.0, retry_delay_s * 2.0**attempt))
    _check_part(remote, part)
    os.replace(part, target)
    return target


def _fetch_into(client: httpx.Client, remote: RemoteFile, part: Path, progress: ProgressFactory) -> None:
    have = part.stat().st_size if part.is_file() else 0
    if remote.size is not None and have > remote.size:
        part.unlink()  # longer than the real file: it cannot be a prefix of it
        have = 0
    if remote.size is not None and have == remote.size:
        return
    headers = {"Range": f"bytes={have}-"} if have else {}
    with client.stream("GET", remote.url, headers=headers) as response:
        if response.status_code == 416 and remote.size is not None and have == remote.size:
            return
        if response.status_code not in (200, 206):
            raise DownloadError(f"{remote.path}: HTTP {response.status_code} from {remote.url}")
        if response.status_code == 200:
            have = 0  # the server ignored the Range: start over
        bar = progress(remote.path, remote.size, have)
        try:
            with part.open("ab" if have else "wb") as handle:
                for block in response.iter_bytes():  # as it arrives: an interruption loses nothing
                    handle.write(block)
                    bar.update(len(block))
        finally:
            bar.close()


def _check_part(remote: RemoteFile, part: Path) -> None:
    size = part.stat().st_size
    if remote.size is not None and size != remote.size:
        part.unlink()
        raise DownloadError(f"{remote.path}: got {size} bytes, the hub announced {remote.size}")
    if remote.sha256:
        actual = _sha256_of(part)
        if actual != remote.sha256.lower():
            part.unlink()
            raise DownloadError(f"{remote.path}: sha256 {actual} differs from the hub's {remote.sha256}")


def list_files(client: httpx.Client, source: str, *, endpoint: str | None = None) -> list[RemoteFile]:
    """The repository listing from ``source`` (``auto``: Hugging Face, then ModelScope)."""
    if source == "hf":
        return list_hf(client, endpoint=endpoint or HF_ENDPOINT)
    if source == "modelscope":
        return list_modelscope(client, endpoint=endpoint or MODELSCOPE_ENDPOINT)
    if source != "auto":
        raise ValueError(f"source must be auto, hf or modelscope, got {source!r}")
    errors = []
    for name in ("hf", "modelscope"):
        try:
            return list_files(client, name)
        except DownloadError as exc:
            errors.append(str(exc))
            print(f"{name}: {exc}", file=sys.stderr)
    raise DownloadError("no hub could list the model: " + "; ".join(errors))


def download_model(
    client: httpx.Client,
    dest: Path = DEFAULT_DEST,
    *,
    source: str = "auto",
    include: Sequence[str] = (),
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    verify: bool = False,
    endpoint: str | None = None,
    progress: ProgressFactory = _Progress,
) -> list[Path]:
    files = select_files(list_files(client, source, endpoint=endpoint), include=include, exclude=exclude)
    if not files:
        raise DownloadError("no file of the repository matches the selection")
    return [download_file(client, f, dest, progress=progress, verify=verify) for f in files]


def fetch_prompt(
    client: httpx.Client, url: str = PROMPT_URL, target: Path = PROMPT_DEST, **options: Any
) -> Path:
    """The default voice's prompt recording (kept when present)."""
    if target.is_file() and target.stat().st_size > 0:
        return target
    return download_file(client, RemoteFile(target.name, url), target.parent, **options)


def main(argv: list[str] | None = None, *, transport: httpx.BaseTransport | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=("auto", "hf", "modelscope"), default="auto")
    parser.add_argument(
        "--endpoint", help="hub base URL (a mirror); default $HF_ENDPOINT / $MODELSCOPE_ENDPOINT"
    )
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    parser.add_argument("--include", action="append", default=[], metavar="GLOB", help="only these files")
    parser.add_argument("--all", action="store_true", help="every file of the repository")
    parser.add_argument("--rl", action="store_true", help="also llm.rl.pt (the RL-tuned LLM, 2 GB)")
    parser.add_argument("--verify", action="store_true", help="re-hash files that look complete")
    parser.add_argument("--no-prompt", action="store_true", help=f"do not fetch {PROMPT_DEST}")
    parser.add_argument("--prompt-url", default=PROMPT_URL)
    parser.add_argument("--prompt-dest", type=Path, default=PROMPT_DEST)
    args = parser.parse_args(argv)
    if args.source == "auto" and args.endpoint:
        parser.error("--endpoint needs --source hf or --source modelscope")
    exclude: tuple[str, ...] = () if args.all else DEFAULT_EXCLUDE
    if args.rl:
        exclude = tuple(p for p in exclude if p != "llm.rl.pt")
    timeout = httpx.Timeout(30.0, read=120.0)
    headers = {"User-Agent": "xiaozhi-gateway"}
    with httpx.Client(follow_redirects=True, timeout=timeout, headers=headers, transport=transport) as client:
        try:
            paths = download_model(
                client,
                args.dest,
                source=args.source,
                include=args.include,
                exclude=exclude,
                verify=args.verify,
                endpoint=args.endpoint,
            )
        except DownloadError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{len(paths)} files in {args.dest}")
        if not args.no_prompt:
            try:
                print(f"default voice prompt: {fetch_prompt(client, args.prompt_url, args.prompt_dest)}")
            except DownloadError as exc:
                print(
                    f"warning: no default voice prompt ({exc}); espeak-ng stands in for it", file=sys.stderr
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
