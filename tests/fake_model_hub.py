"""A fake ModelScope + Hugging Face hub on loopback for scripts/download_model.py's tests."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import pytest

import scripts.hub_download as hub_download
from scripts.download_model import ASR, TTS, main

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
