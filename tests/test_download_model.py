"""scripts/download_model.py against a fake ModelScope + HF hub on loopback: what is fetched, from where."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from gateway.asr.base import ASRModelMissing
from gateway.asr.funasr_backend import FunASRBackend
from gateway.config import ASRConfig
from scripts.download_model import ASR, TTS, main
from tests.fake_model_hub import ASR_DEFAULT, ASR_FILES, TTS_DEFAULT, TTS_FILES, FakeHub, run, tree
from tests.fake_model_hub import hub as hub  # a fixture: pytest finds it by this name


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
