"""scripts/download_model.py against a fake ModelScope + Hugging Face hub served over HTTP on loopback."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import httpx
import pytest

import scripts.hub_download as hub_download
from gateway.asr.base import ASRModelMissing
from gateway.asr.funasr_backend import FunASRBackend
from gateway.config import ASRConfig
from scripts.download_model import ASR, TTS, main
from scripts.hub_download import DownloadError, RemoteFile, download_file, list_hf, list_modelscope

TTS_FILES = {
    "cosyvoice3.yaml": b"sample_rate: 24000\n" * 3,
    "llm.pt": bytes(range(256)) * 400,  # 100 KiB: big enough to cut in the middle
    "flow.pt": b"flow" * 3000,
    "hift.pt": b"hift" * 100,
    "campplus.onnx": b"campplus",
    "speech_tokenizer_v3.onnx": b"tokenizer" * 50,
    "speech_tokenizer_v3.batch.onnx": b"batch",
    "flow.decoder.estimator.fp32.onnx": b"trt",
    "llm.rl.pt": b"rl" * 100,
    "CosyVoice-BlankEN/config.json": b"{}",
    "CosyVoice-BlankEN/tokenizer_config.json": b"{}",
    "CosyVoice-BlankEN/vocab.json": b'{"a": 0}',
    "CosyVoice-BlankEN/merges.txt": b"#version: 0.2\n",
    "CosyVoice-BlankEN/model.safetensors": b"unused" * 10,
    "asset/dingding.png": b"png",
}
CONFIGURATION = {
    "framework": "pytorch",
    "file_path_metas": {
        "init_param": "model.pt",
        "config": "config.yaml",
        "tokenizer_conf": {"bpemodel": "chn_jpn_yue_eng_ko_spectok.bpe.model"},
        "frontend_conf": {"cmvn_file": "am.mvn"},
    },
}
ASR_FILES = {
    "configuration.json": json.dumps(CONFIGURATION).encode(),
    "config.yaml": b"model: SenseVoiceSmall\n",
    "model.pt": bytes(range(256)) * 300,
    "am.mvn": b"<Nnet>\n",
    "chn_jpn_yue_eng_ko_spectok.bpe.model": b"sentencepiece",
    "tokens.json": b'["<unk>"]',
    "README.md": b"# SenseVoice",
    "example/zh.mp3": b"mp3" * 100,
}
TTS_DEFAULT = {
    p for p in TTS_FILES if p not in {"speech_tokenizer_v3.batch.onnx", "llm.rl.pt", "asset/dingding.png"}
}
TTS_DEFAULT -= {"flow.decoder.estimator.fp32.onnx", "CosyVoice-BlankEN/model.safetensors"}
ASR_DEFAULT = set(ASR_FILES) - {"README.md", "example/zh.mp3"}


class FakeHub(ThreadingHTTPServer):
    """One loopback server answering both hubs' APIs for both models; records every file request."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.repos = {
            ("modelscope", TTS.repos["modelscope"]): dict(TTS_FILES),
            ("hf", TTS.repos["hf"]): dict(TTS_FILES),
            ("modelscope", ASR.repos["modelscope"]): dict(ASR_FILES),
            ("hf", ASR.repos["hf"]): dict(ASR_FILES),
        }
        self.down: set[str] = set()  # hubs whose APIs answer 503
        self.announced: dict[tuple[str, str], int] = {}  # (hub, path) -> size in the listing
        self.bad_sha: set[tuple[str, str]] = set()  # (hub, path) listed with a wrong checksum
        self.cut_once: dict[str, int] = {}  # path -> bytes sent before the connection drops
        self.ignore_range = False  # answer 200 with the whole file to a Range request
        self.listings: list[tuple[str, str]] = []  # (hub, repo)
        self.fetches: list[tuple[str, str, str | None]] = []  # (hub, path, Range header)
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def both(self, path: str, data: bytes) -> None:
        for (_, _), files in self.repos.items():
            if path in files:
                files[path] = data

    def listing(self, hub: str, repo: str) -> object:
        files = self.repos[(hub, repo)]
        self.listings.append((hub, repo))

        def sha(path: str) -> str:
            return "0" * 64 if (hub, path) in self.bad_sha else hashlib.sha256(files[path]).hexdigest()

        def size(path: str) -> int:
            return self.announced.get((hub, path), len(files[path]))

        if hub == "hf":  # small files are plain git blobs, the rest in LFS
            siblings = []
            for path, data in files.items():
                entry: dict[str, object] = {"rfilename": path, "size": size(path)}
                if len(data) > 1000:
                    entry["lfs"] = {"sha256": sha(path), "size": size(path), "pointerSize": 130}
                    entry["blobId"] = "f" * 40
                else:
                    header = f"blob {len(data)}\0".encode()
                    entry["blobId"] = (
                        "0" * 40 if (hub, path) in self.bad_sha else hashlib.sha1(header + data).hexdigest()
                    )
                siblings.append(entry)
            return {"id": repo, "siblings": siblings}
        entries: list[dict[str, object]] = [{"Type": "tree", "Path": "CosyVoice-BlankEN", "Size": 0}]
        entries += [{"Type": "blob", "Path": p, "Size": size(p), "Sha256": sha(p)} for p in files]
        return {"Code": 200, "Data": {"Files": entries}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeHub

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        query = parse_qs(url.query)
        hub = "modelscope" if url.path.startswith("/api/v1/") else "hf"
        if hub in self.server.down and url.path.startswith("/api/"):
            return self.reply(503, b"down")
        for (name, repo), files in self.server.repos.items():
            if name != hub:
                continue
            if url.path in (f"/api/models/{repo}", f"/api/v1/models/{repo}/repo/files"):
                return self.reply(200, json.dumps(self.server.listing(hub, repo)).encode())
            if url.path == f"/api/v1/models/{repo}/repo":
                return self.send_file(hub, files, query["FilePath"][0])
            if url.path.startswith(f"/{repo}/resolve/main/"):
                return self.send_file(hub, files, unquote(url.path.removeprefix(f"/{repo}/resolve/main/")))
        if url.path == "/prompt.wav":
            return self.send_file("web", {"prompt.wav": b"RIFF....WAVE"}, "prompt.wav")
        return self.reply(404, b"not found")

    def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def send_file(self, hub: str, files: dict[str, bytes], path: str) -> None:
        ranged = self.headers.get("Range")
        with self.server.lock:
            self.server.fetches.append((hub, path, ranged))
            cut = self.server.cut_once.pop(path, None)
        if path not in files:
            return self.reply(404, b"no such file")
        data = files[path]
        if self.server.ignore_range:
            ranged = None
        start = int(ranged.removeprefix("bytes=").split("-")[0]) if ranged else 0
        headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if ranged else {}
        if cut is None:
            return self.reply(206 if ranged else 200, data[start:], headers)
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start : start + cut])
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)  # the connection drops mid-file
        self.close_connection = True


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    monkeypatch.setattr(hub_download, "RETRY_DELAY_S", 0.0)
    server = FakeHub()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run(hub: FakeHub, tmp_path: Path, *args: str) -> int:
    return main(
        [
            "--modelscope-endpoint", hub.url, "--hf-endpoint", hub.url,
            "--tts-dest", str(tmp_path / "tts"), "--asr-dest", str(tmp_path / "asr"),
            "--prompt-url", f"{hub.url}/prompt.wav", "--prompt-dest", str(tmp_path / "voices" / "default.wav"),
            *args,
        ]
    )  # fmt: skip


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_both_models_come_from_modelscope_verified_and_complete(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(hub, tmp_path) == 0
    assert tree(tmp_path / "tts") == {p: TTS_FILES[p] for p in TTS_DEFAULT}
    assert tree(tmp_path / "asr") == {p: ASR_FILES[p] for p in ASR_DEFAULT}
    assert (tmp_path / "voices" / "default.wav").read_bytes() == b"RIFF....WAVE"
    assert {h for h, _, _ in hub.fetches} == {"modelscope", "web"}  # no fallback needed
    tts_order = [p for h, p, _ in hub.fetches if h == "modelscope" and p in TTS_FILES]
    asr_order = [p for h, p, _ in hub.fetches if h == "modelscope" and p in ASR_FILES]
    assert tts_order[-1] == "cosyvoice3.yaml" and asr_order[-1] == "config.yaml"  # the loaders' marker last
    out = capsys.readouterr().out
    assert "Fun-CosyVoice3-0.5B-2512: 10 files" in out and "SenseVoiceSmall: 6 files" in out
    assert "Silero VAD: shipped in the silero-vad package" in out and "python -m gateway check" in out
    hub.fetches.clear()
    assert run(hub, tmp_path) == 0  # a second run only lists: every file is complete
    assert hub.fetches == []


@pytest.mark.parametrize("only", ["tts", "asr"])
def test_only_one_model_set(hub: FakeHub, tmp_path: Path, only: str) -> None:
    assert run(hub, tmp_path, "--only", only) == 0
    other = "asr" if only == "tts" else "tts"
    assert tree(tmp_path / only) and not (tmp_path / other).exists()
    assert {repo for _, repo in hub.listings} == {(TTS if only == "tts" else ASR).repos["modelscope"]}
    assert (tmp_path / "voices" / "default.wav").exists() == (only == "tts")


@pytest.mark.parametrize("failure", ["listing", "checksum"])
def test_modelscope_failing_falls_back_to_hugging_face(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str], failure: str
) -> None:
    if failure == "listing":
        hub.down.add("modelscope")
    else:
        hub.bad_sha.add(("modelscope", "model.pt"))
    assert run(hub, tmp_path, "--only", "asr") == 0
    assert tree(tmp_path / "asr") == {p: ASR_FILES[p] for p in ASR_DEFAULT}
    assert hub.listings[-1] == ("hf", ASR.repos["hf"])
    err = capsys.readouterr().err
    assert "SenseVoiceSmall from ModelScope" in err and "trying Hugging Face" in err
    assert ("HTTP 503" if failure == "listing" else "model.pt: sha256") in err


def test_an_interrupted_download_resumes_with_a_range_request(hub: FakeHub, tmp_path: Path) -> None:
    hub.cut_once["llm.pt"] = 40_000
    assert run(hub, tmp_path, "--only", "tts", "--include", "llm.pt") == 0
    assert (tmp_path / "tts" / "llm.pt").read_bytes() == TTS_FILES["llm.pt"]
    assert [r for _, p, r in hub.fetches if p == "llm.pt"] == [None, "bytes=40000-"]
    assert not list((tmp_path / "tts").rglob("*.part"))


def test_a_part_left_by_an_earlier_run_is_resumed(hub: FakeHub, tmp_path: Path) -> None:
    (tmp_path / "asr").mkdir()
    (tmp_path / "asr" / "model.pt.part").write_bytes(ASR_FILES["model.pt"][:30_000])
    assert run(hub, tmp_path, "--only", "asr", "--source", "hf") == 0
    assert (tmp_path / "asr" / "model.pt").read_bytes() == ASR_FILES["model.pt"]
    assert [r for _, p, r in hub.fetches if p == "model.pt"] == ["bytes=30000-"]


def test_a_stale_part_that_does_not_verify_is_fetched_again_from_the_start(
    hub: FakeHub, tmp_path: Path
) -> None:
    (tmp_path / "tts").mkdir()
    (tmp_path / "tts" / "flow.pt.part").write_bytes(b"an older release" * 10)
    assert run(hub, tmp_path, "--only", "tts", "--include", "flow.pt", "--source", "hf") == 0
    assert (tmp_path / "tts" / "flow.pt").read_bytes() == TTS_FILES["flow.pt"]
    assert [r for _, p, r in hub.fetches if p == "flow.pt"] == ["bytes=160-", None]


def test_a_server_that_ignores_range_restarts_the_file(hub: FakeHub, tmp_path: Path) -> None:
    hub.ignore_range = True
    (tmp_path / "tts").mkdir()
    (tmp_path / "tts" / "llm.pt.part").write_bytes(TTS_FILES["llm.pt"][:5000])
    assert run(hub, tmp_path, "--only", "tts", "--include", "llm.pt") == 0
    assert (tmp_path / "tts" / "llm.pt").read_bytes() == TTS_FILES["llm.pt"]
    assert len([p for _, p, _ in hub.fetches if p == "llm.pt"]) == 1  # the whole file, once


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--rl"], TTS_DEFAULT | {"llm.rl.pt"}),
        (["--all"], set(TTS_FILES)),
        (["--include", "*.pt", "--include", "CosyVoice-BlankEN/v*"], {p for p in TTS_FILES if p.endswith(".pt")}
         | {"CosyVoice-BlankEN/vocab.json"}),
    ],
)  # fmt: skip
def test_selection_flags(hub: FakeHub, tmp_path: Path, flags: list[str], expected: set[str]) -> None:
    assert run(hub, tmp_path, "--only", "tts", "--no-prompt", *flags) == 0
    assert set(tree(tmp_path / "tts")) == expected


@pytest.mark.parametrize(("source", "problem", "message"), [
    ("modelscope", "sha", "sha256 [0-9a-f]{64} differs from the hub's 0{64}"),
    ("hf", "sha", "git blob id [0-9a-f]{40} differs from the hub's 0{40}"),  # a small file: checked by its git blob id
    ("modelscope", "size", "got 12 bytes, the hub announced 19"),
])  # fmt: skip
def test_a_corrupted_file_is_detected_and_never_put_in_place(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, problem: str, message: str
) -> None:
    hub.both("campplus.onnx", b"campplus-bad")
    if problem == "sha":
        hub.bad_sha.add((source, "campplus.onnx"))
    else:
        hub.announced[(source, "campplus.onnx")] = 19
    assert run(hub, tmp_path, "--only", "tts", "--source", source, "--no-prompt") == 1
    err = capsys.readouterr().err
    assert (
        "error: Fun-CosyVoice3-0.5B-2512" in err and "campplus.onnx" in err and "the file was not kept" in err
    )
    assert re.search(message, err) and "Traceback" not in err
    files = tree(tmp_path / "tts")
    assert "campplus.onnx" not in files and "campplus.onnx.part" not in files
    assert "cosyvoice3.yaml" not in files  # the directory never looks complete to the gateway


def test_verify_rehashes_complete_files_and_replaces_a_tampered_one(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(hub, tmp_path, "--only", "asr") == 0
    model = tmp_path / "asr" / "model.pt"
    tampered = bytearray(model.read_bytes())
    tampered[1000] ^= 0xFF
    model.write_bytes(bytes(tampered))  # same size: only a hash notices
    hub.fetches.clear()
    assert run(hub, tmp_path, "--only", "asr") == 0
    assert hub.fetches == [] and model.read_bytes() != ASR_FILES["model.pt"]
    assert run(hub, tmp_path, "--only", "asr", "--verify") == 0
    assert "model.pt: sha256" in capsys.readouterr().err
    assert model.read_bytes() == ASR_FILES["model.pt"]
    assert [p for _, p, _ in hub.fetches] == ["model.pt"]


def test_files_named_by_configuration_json_are_fetched_too(hub: FakeHub, tmp_path: Path) -> None:
    config = json.loads(ASR_FILES["configuration.json"])
    config["file_path_metas"]["frontend_conf"]["cmvn_file"] = "extra/am2.mvn"
    hub.both("configuration.json", json.dumps(config).encode())
    hub.repos[("modelscope", ASR.repos["modelscope"])]["extra/am2.mvn"] = b"<Nnet2>"
    assert run(hub, tmp_path, "--only", "asr") == 0
    assert (tmp_path / "asr" / "extra" / "am2.mvn").read_bytes() == b"<Nnet2>"


def test_a_release_without_a_file_our_loader_needs_is_named(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for hub_name in ("modelscope", "hf"):
        del hub.repos[(hub_name, TTS.repos[hub_name])]["hift.pt"]
    assert run(hub, tmp_path, "--only", "tts") == 1
    err = capsys.readouterr().err
    assert "has no hift.pt: the release changed" in err and "Hugging Face:" in err and "ModelScope:" in err


def test_no_hub_reachable_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    argv = [
        "--modelscope-endpoint",
        dead,
        "--hf-endpoint",
        dead,
        "--asr-dest",
        str(tmp_path),
        "--only",
        "asr",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot list files at" in err and "run the same command again" in err and "Traceback" not in err


def test_listing_parsers_and_unsafe_paths(hub: FakeHub, tmp_path: Path) -> None:
    with httpx.Client() as client:
        hf = {f.path: f for f in list_hf(client, ASR.repos["hf"], endpoint=hub.url)}
        ms = {f.path: f for f in list_modelscope(client, ASR.repos["modelscope"], endpoint=hub.url)}
        assert (
            hf["model.pt"].sha256
            == ms["model.pt"].sha256
            == hashlib.sha256(ASR_FILES["model.pt"]).hexdigest()
        )
        assert hf["model.pt"].git_sha1 is None and hf["am.mvn"].git_sha1 and hf["am.mvn"].sha256 is None
        assert ms["model.pt"].size == len(ASR_FILES["model.pt"])
        hub.repos[("hf", ASR.repos["hf"])]["../escape.txt"] = b"x"
        with pytest.raises(DownloadError, match="unsafe"):
            list_hf(client, ASR.repos["hf"], endpoint=hub.url)
        with pytest.raises(DownloadError, match="HTTP 404"):
            download_file(client, RemoteFile("gone.bin", f"{hub.url}/nothing"), tmp_path, retries=0)


def test_usage_errors_are_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--include", "llm.pt"])
    assert exit_info.value.code == 2 and "--include and --all need --only" in capsys.readouterr().err


def test_asr_model_auto_uses_the_downloaded_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ASRModelMissing, match=r"download_model.py --only asr"):
        FunASRBackend.locate_model(ASRConfig(download=False))  # nothing local: the hub id, not there
    local = tmp_path / "models" / "SenseVoiceSmall"
    local.mkdir(parents=True)
    with pytest.raises(ASRModelMissing, match="config.yaml is missing.*download_model.py --only asr"):
        FunASRBackend.locate_model(ASRConfig())  # half downloaded: named, with the fix
    for name, data in ASR_FILES.items():
        (local / name).parent.mkdir(exist_ok=True)
        (local / name).write_bytes(data)
    assert ASRConfig().model == "auto"
    assert FunASRBackend.locate_model(ASRConfig()) == "models/SenseVoiceSmall"
