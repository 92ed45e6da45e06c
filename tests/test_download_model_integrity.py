"""scripts/download_model.py's interrupted, partial and corrupted downloads (against the fake hub)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import httpx
import pytest

from scripts.download_model import ASR
from scripts.hub_download import DownloadError, RemoteFile, download_file, list_hf, list_modelscope
from tests.fake_model_hub import ASR_FILES, TTS_FILES, FakeHub, run, tree
from tests.fake_model_hub import hub as hub  # a fixture: pytest finds it by this name


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
