"""scripts/download_model.py against a fake hub (httpx.MockTransport): listing, resume, checks, fallback."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import httpx
import pytest

from scripts.download_model import (
    DEFAULT_EXCLUDE,
    REPO_ID,
    DownloadError,
    RemoteFile,
    download_file,
    download_model,
    fetch_prompt,
    list_hf,
    list_modelscope,
    main,
    select_files,
)

FILES = {
    "cosyvoice3.yaml": b"sample_rate: 24000\n" * 3,
    "llm.pt": bytes(range(256)) * 40,
    "flow.pt": b"flow" * 3000,
    "llm.rl.pt": b"rl" * 100,
    "CosyVoice-BlankEN/vocab.json": b'{"a": 0}',
    "CosyVoice-BlankEN/model.safetensors": b"unused" * 10,
    "asset/dingding.png": b"png",
}


class Silent:
    def __init__(self, *args: object) -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class Cut(httpx.SyncByteStream):
    """A body that breaks off after ``keep`` bytes, like a dropped connection."""

    def __init__(self, data: bytes, keep: int) -> None:
        self.data, self.keep = data, keep

    def __iter__(self) -> Iterator[bytes]:
        yield self.data[: self.keep]
        raise httpx.RemoteProtocolError("peer closed connection")


class FakeHub:
    """Serves FILES the way Hugging Face and ModelScope do; records every request."""

    def __init__(self, files: dict[str, bytes] = FILES) -> None:
        self.files = dict(files)
        self.announced: dict[str, int] = {}  # size overrides in the listing
        self.bad_sha: set[str] = set()
        self.cut_once: dict[str, int] = {}  # path -> bytes sent before the first transfer breaks
        self.ignore_range = False
        self.hf_down = False
        self.requests: list[httpx.Request] = []
        self.served: dict[str, int] = {}

    def sha(self, path: str) -> str:
        return "0" * 64 if path in self.bad_sha else hashlib.sha256(self.files[path]).hexdigest()

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        url = urlparse(str(request.url))
        query = parse_qs(url.query)
        if url.path == f"/api/models/{REPO_ID}":
            if self.hf_down:
                return httpx.Response(503)
            siblings = [
                {"rfilename": p, "size": self.announced.get(p, len(d)), "lfs": {"sha256": self.sha(p)}}
                for p, d in self.files.items()
            ]
            return httpx.Response(200, json={"id": REPO_ID, "siblings": siblings})
        if url.path == f"/api/v1/models/{REPO_ID}/repo/files":
            entries = [{"Type": "tree", "Path": "CosyVoice-BlankEN", "Size": 0}]
            entries += [
                {"Type": "blob", "Path": p, "Name": p, "Size": len(d), "Sha256": self.sha(p)}
                for p, d in self.files.items()
            ]
            return httpx.Response(200, json={"Code": 200, "Data": {"Files": entries}})
        prefix = f"/{REPO_ID}/resolve/main/"
        if url.path.startswith(prefix):
            return self.serve(unquote(url.path[len(prefix) :]), request)
        if url.path == f"/api/v1/models/{REPO_ID}/repo":
            return self.serve(query["FilePath"][0], request)
        if url.path == "/prompt.wav":
            return self.serve("prompt.wav", request)
        return httpx.Response(404)

    def serve(self, path: str, request: httpx.Request) -> httpx.Response:
        if path not in self.files:
            return httpx.Response(404)
        data = self.files[path]
        start, status = 0, 200
        ranged = request.headers.get("Range")
        if ranged and not self.ignore_range:
            start, status = int(ranged.removeprefix("bytes=").split("-")[0]), 206
        body = data[start:]
        self.served[path] = self.served.get(path, 0) + len(body)
        if path in self.cut_once:
            return httpx.Response(status, stream=Cut(body, self.cut_once.pop(path)))
        return httpx.Response(status, content=body)

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self.handler), base_url="https://hub.test")


@pytest.fixture
def hub() -> FakeHub:
    return FakeHub()


def get(hub: FakeHub, dest: Path, **options: object) -> list[Path]:
    with hub.client() as client:
        return download_model(client, dest, progress=Silent, endpoint="https://hub.test", **options)  # type: ignore[arg-type]


def test_hf_listing_and_default_selection(hub: FakeHub) -> None:
    with hub.client() as client:
        files = list_hf(client, endpoint="https://hub.test")
    by_path = {f.path: f for f in files}
    assert by_path["llm.pt"] == RemoteFile(
        "llm.pt", f"https://hub.test/{REPO_ID}/resolve/main/llm.pt", 10240, hub.sha("llm.pt")
    )
    chosen = [f.path for f in select_files(files)]
    assert chosen == ["CosyVoice-BlankEN/vocab.json", "flow.pt", "llm.pt", "cosyvoice3.yaml"]  # config last
    assert "llm.rl.pt" in DEFAULT_EXCLUDE
    assert [f.path for f in select_files(files, include=["*.pt"])] == ["flow.pt", "llm.pt", "llm.rl.pt"]
    assert len(select_files(files, exclude=())) == len(FILES)


def test_download_writes_every_file_then_skips_complete_ones(hub: FakeHub, tmp_path: Path) -> None:
    paths = get(hub, tmp_path, source="hf")
    assert [p.relative_to(tmp_path).as_posix() for p in paths][-1] == "cosyvoice3.yaml"
    for path in paths:
        assert path.read_bytes() == FILES[path.relative_to(tmp_path).as_posix()]
    assert not list(tmp_path.rglob("*.part"))
    hub.requests.clear()
    get(hub, tmp_path, source="hf")
    assert [r.url.path for r in hub.requests] == [f"/api/models/{REPO_ID}"]  # listing only
    get(hub, tmp_path, source="hf", verify=True)  # hashes match: still nothing fetched
    assert len(hub.requests) == 2


def test_a_partial_file_is_resumed_with_a_range_request(hub: FakeHub, tmp_path: Path) -> None:
    data = FILES["llm.pt"]
    (tmp_path / "llm.pt.part").write_bytes(data[:4000])
    get(hub, tmp_path, source="hf", include=["llm.pt"])
    assert (tmp_path / "llm.pt").read_bytes() == data
    assert hub.served["llm.pt"] == len(data) - 4000
    assert hub.requests[-1].headers["Range"] == "bytes=4000-"


def test_a_dropped_connection_resumes_where_it_stopped(hub: FakeHub, tmp_path: Path) -> None:
    hub.cut_once["flow.pt"] = 5000
    with hub.client() as client:
        files = {f.path: f for f in list_hf(client, endpoint="https://hub.test")}
        path = download_file(client, files["flow.pt"], tmp_path, progress=Silent, retry_delay_s=0)
    assert path.read_bytes() == FILES["flow.pt"]
    assert [r.headers.get("Range") for r in hub.requests[1:]] == [None, "bytes=5000-"]


def test_a_server_that_ignores_range_restarts_the_file(hub: FakeHub, tmp_path: Path) -> None:
    hub.ignore_range = True
    (tmp_path / "llm.pt.part").write_bytes(b"garbage that is not the start of the file")
    get(hub, tmp_path, source="hf", include=["llm.pt"])
    assert (tmp_path / "llm.pt").read_bytes() == FILES["llm.pt"]


@pytest.mark.parametrize("problem", ["size", "sha"])
def test_a_file_that_does_not_match_the_listing_is_rejected(
    hub: FakeHub, tmp_path: Path, problem: str
) -> None:
    if problem == "size":
        hub.announced["flow.pt"] = len(FILES["flow.pt"]) + 7
    else:
        hub.bad_sha.add("flow.pt")
    with pytest.raises(DownloadError, match="flow.pt"):
        get(hub, tmp_path, source="hf", include=["flow.pt"])
    assert not (tmp_path / "flow.pt").exists() and not (tmp_path / "flow.pt.part").exists()


def test_a_part_longer_than_the_file_is_discarded(hub: FakeHub, tmp_path: Path) -> None:
    (tmp_path / "cosyvoice3.yaml.part").write_bytes(b"x" * 1000)
    get(hub, tmp_path, source="hf", include=["cosyvoice3.yaml"])
    assert (tmp_path / "cosyvoice3.yaml").read_bytes() == FILES["cosyvoice3.yaml"]


def test_modelscope_listing_and_download(hub: FakeHub, tmp_path: Path) -> None:
    with hub.client() as client:
        files = list_modelscope(client, endpoint="https://hub.test")
    assert sorted(f.path for f in files) == sorted(FILES)  # directories ("tree") are skipped
    paths = get(hub, tmp_path, source="modelscope", include=["CosyVoice-BlankEN/*"])
    assert {p.relative_to(tmp_path).as_posix() for p in paths} == {
        "CosyVoice-BlankEN/vocab.json",
        "CosyVoice-BlankEN/model.safetensors",
    }
    assert (tmp_path / "CosyVoice-BlankEN" / "vocab.json").read_bytes() == FILES[
        "CosyVoice-BlankEN/vocab.json"
    ]


def test_auto_falls_back_to_modelscope(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scripts.download_model as dm

    monkeypatch.setattr(dm, "HF_ENDPOINT", "https://hub.test")
    monkeypatch.setattr(dm, "MODELSCOPE_ENDPOINT", "https://hub.test")
    hub.hf_down = True
    with hub.client() as client:
        paths = download_model(client, tmp_path, source="auto", include=["llm.pt"], progress=Silent)
    assert paths == [tmp_path / "llm.pt"] and "/repo" in hub.requests[-1].url.path


def test_unsafe_paths_in_a_listing_are_refused(hub: FakeHub, tmp_path: Path) -> None:
    hub.files["../escape.txt"] = b"x"
    with pytest.raises(DownloadError, match="unsafe"):
        get(hub, tmp_path, source="hf")


def test_prompt_is_fetched_once_and_main_reports_errors(hub: FakeHub, tmp_path: Path) -> None:
    hub.files["prompt.wav"] = b"RIFF....WAVE"
    target = tmp_path / "voices" / "default.wav"
    with hub.client() as client:
        assert fetch_prompt(client, "https://hub.test/prompt.wav", target, progress=Silent) == target
        assert target.read_bytes() == b"RIFF....WAVE"
        served = hub.served["prompt.wav"]
        fetch_prompt(client, "https://hub.test/prompt.wav", target)
    assert hub.served["prompt.wav"] == served
    transport = httpx.MockTransport(hub.handler)
    dest = tmp_path / "model"
    argv = ["--source", "hf", "--endpoint", "https://hub.test", "--dest", str(dest), "--include", "llm.pt"]
    assert main([*argv, "--prompt-url", "https://hub.test/missing.wav", "--prompt-dest", str(target)],
                transport=transport) == 0  # fmt: skip
    assert (dest / "llm.pt").read_bytes() == FILES["llm.pt"]
    hub.hf_down = True
    assert main([*argv, "--no-prompt"], transport=transport) == 1
