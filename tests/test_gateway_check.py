"""`python -m gateway check` on the tiny generated models, on broken copies of them, and at start-up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from audio_codecs.wav import wav_bytes
from cosyvoice.text.tokenizer import COSYVOICE3_ADDED_TOKENS
from gateway.__main__ import main
from scripts.make_tiny_funasr_model import make_tiny_model
from scripts.make_tiny_model import make_model_dir
from tests.gateway_server import running_gateway

ROOT = Path(__file__).resolve().parents[1]
TTS_FIX = "python scripts/download_model.py --only tts"


def _prompt_wav() -> bytes:
    t = np.arange(16000) / 16000
    wave = (
        0.3
        * np.sin(2 * np.pi * 180 * t + 3 * np.sin(2 * np.pi * 2 * t))
        * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    )
    return wav_bytes((wave * 32767).astype(np.int16), 16000)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("check") / "model", "tiny", seed=0)


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("voices")
    (directory / "default.wav").write_bytes(_prompt_wav())
    (directory / "default.yaml").write_text(
        "prompt_wav: default.wav\nprompt_text: 你好。\n", encoding="utf-8"
    )
    return directory


def write_config(path: Path, model_dir: Path, voices_dir: Path, asr: dict | None = None) -> Path:
    config = {
        "tts": {
            "backend": "cosyvoice",
            "model_dir": str(model_dir),
            "voices_dir": str(voices_dir),
            "device": "cpu",
        },
        "asr": asr or {"backend": "none"},
        "engine": {"max_llm_len": 512},
    }
    path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    return path


def run_check(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict, str]:
    code = main(["check", "--config", str(config), "--json", *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.out + captured.err


def rows(report: dict) -> dict[str, dict]:
    return {row["name"]: row for row in report["checks"]}


def test_cli_all_green_on_the_tiny_models(tiny_model: Path, voices_dir: Path, tmp_path: Path) -> None:
    """The real command in a subprocess: every model loads, speaks, and the tiny ASR hears it back."""
    asr_model = make_tiny_model(tmp_path / "asr", says="你好")
    config = write_config(
        tmp_path / "config.yaml", tiny_model, voices_dir, {"backend": "funasr", "model": str(asr_model)}
    )
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "all checks passed" in out
    for name in ("tts llm.pt", "tts flow.pt", "tts hift.pt", "tts speech_tokenizer_v3.onnx", "tts synthesis"):
        assert name in out
    assert "speech round trip" in out and "recognised '你好'" in out
    assert "failed" not in out and "missing" not in out and "Traceback" not in proc.stderr


def test_json_report_lists_every_check_as_ok(
    tiny_model: Path, voices_dir: Path, tmp_path: Path, capsys
) -> None:
    code, report, _ = run_check(write_config(tmp_path / "c.yaml", tiny_model, voices_dir), capsys)
    assert code == 0 and report["ok"] is True
    found = rows(report)
    assert found["tts tokenizer"]["detail"].endswith("<|endofprompt|> = 151646")
    assert "keys and shapes match" in found["tts llm.pt"]["detail"]
    assert found["tts synthesis"]["status"] == "ok" and "s of audio" in found["tts synthesis"]["detail"]
    assert found["asr model"]["status"] == "skipped"  # asr.backend: none
    assert all(row["status"] in ("ok", "skipped") for row in report["checks"])


# ---- broken copies ---------------------------------------------------------------------------------


def _remove_hift(model: Path) -> None:
    (model / "hift.pt").unlink()


def _truncate_flow(model: Path) -> None:
    path = model / "flow.pt"
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def _rename_llm_key(model: Path) -> None:
    state = torch.load(model / "llm.pt", weights_only=True)
    state["llm.model.model.final_norm.weight"] = state.pop("llm.model.model.norm.weight")
    torch.save(state, model / "llm.pt")


def _rename_onnx_input(model: Path) -> None:
    import onnx

    path = model / "speech_tokenizer_v3.onnx"
    graph_model = onnx.load(str(path))
    graph_model.graph.input[0].name = "speech"
    for node in graph_model.graph.node:
        node.input[:] = ["speech" if name == "feats" else name for name in node.input]
    onnx.save(graph_model, str(path))


def _unknown_flow_class(model: Path) -> None:
    path = model / "cosyvoice3.yaml"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("CausalMaskedDiffWithDiT", "MaskedDiffWithXvec"), encoding="utf-8")


def _unknown_sampling_function(model: Path) -> None:
    path = model / "cosyvoice3.yaml"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("common.ras_sampling", "common.nucleus_sampling"), encoding="utf-8")


def _tokenizer_without_endofprompt(model: Path) -> None:
    path = model / "CosyVoice-BlankEN" / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    specials = ["<|endoftext|>", *(t for t in COSYVOICE3_ADDED_TOKENS if t != "<|endofprompt|>")]
    entry = next(iter(config["added_tokens_decoder"].values()))
    config["added_tokens_decoder"] = {
        str(151643 + i): {**entry, "content": token} for i, token in enumerate(specials)
    }
    path.write_text(json.dumps(config), encoding="utf-8")


def _vocab_one_entry_longer(model: Path) -> None:
    blank_en = model / "CosyVoice-BlankEN"
    vocab = json.loads((blank_en / "vocab.json").read_text(encoding="utf-8"))
    vocab["extra-entry"] = len(vocab)
    (blank_en / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (blank_en / "tokenizer_config.json").unlink()


BROKEN: dict[str, tuple[Callable[[Path], None], str, str, str, str]] = {
    # case: (break it, check name, status, words in the detail, words in the fix)
    "missing file": (_remove_hift, "tts files", "missing", "hift.pt", TTS_FIX),
    "truncated pt": (
        _truncate_flow,
        "tts flow.pt",
        "failed",
        "expected ~3",
        "re-download flow.pt: it is truncated",
    ),
    "renamed key": (
        _rename_llm_key,
        "tts llm.pt",
        "failed",
        "lacks key 'llm.model.model.norm.weight' (found 'llm.model.model.final_norm.weight' instead, renamed?)",
        "not a Fun-CosyVoice3-0.5B-2512 release",
    ),
    "onnx input name": (
        _rename_onnx_input,
        "tts speech_tokenizer_v3.onnx",
        "failed",
        "input 0 is named 'speech', expected 'feats'",
        f"re-download speech_tokenizer_v3.onnx; if it persists, this is not a Fun-CosyVoice3-0.5B-2512 release ({TTS_FIX})",
    ),
    "yaml unknown class": (
        _unknown_flow_class,
        "tts cosyvoice3.yaml",
        "failed",
        "'flow' must be !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT, got !new:cosyvoice.flow.flow.MaskedDiffWithXvec",
        "not a Fun-CosyVoice3-0.5B-2512 release",
    ),
    "yaml unknown function": (
        _unknown_sampling_function,
        "tts cosyvoice3.yaml",
        "failed",
        "unknown class llm.sampling !name:cosyvoice.utils.common.nucleus_sampling",
        "not a Fun-CosyVoice3-0.5B-2512 release",
    ),
    "tokenizer without endofprompt": (
        _tokenizer_without_endofprompt,
        "tts tokenizer",
        "failed",
        "tokenizer_config.json lacks <|endofprompt|> (id 151646 is '[breath]')",
        "re-download CosyVoice-BlankEN/tokenizer_config.json",
    ),
    "endofprompt at another id": (
        _vocab_one_entry_longer,
        "tts tokenizer",
        "failed",
        "<|endofprompt|> has id 151647, the LLM expects 151646",
        "re-download CosyVoice-BlankEN",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_copy_names_the_problem_and_the_fix(
    case: str, tiny_model: Path, voices_dir: Path, tmp_path: Path, capsys
) -> None:
    breaker, name, status, detail, fix = BROKEN[case]
    model = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    breaker(model)
    code, report, output = run_check(
        write_config(tmp_path / "c.yaml", model, voices_dir), capsys, "--no-synth"
    )
    assert code == 1 and report["ok"] is False
    row = rows(report)[name]
    assert row["status"] == status, row
    assert detail in row["detail"], row
    assert fix in row["fix"], row
    assert "Traceback" not in output
    assert rows(report)["tts load"]["status"] == "skipped"  # nothing is loaded from a broken directory
    others = [r for r in report["checks"] if r["name"] != name and r["status"] in ("failed", "missing")]
    assert others == [], others  # one problem, one row


def test_no_model_directory_is_missing_with_the_download_command(
    voices_dir: Path, tmp_path: Path, capsys
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps({"tts": {"backend": "auto", "model_dir": str(tmp_path / "none"), "voices_dir": str(voices_dir)},
                    "asr": {"backend": "none"}}),
        encoding="utf-8",
    )  # fmt: skip
    code, report, _ = run_check(config, capsys, "--no-synth")
    assert code == 1
    row = rows(report)["tts model"]
    assert row["status"] == "missing" and str(tmp_path / "none") in row["detail"] and TTS_FIX in row["fix"]


def test_a_bad_config_file_is_a_message_not_a_trace(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("tts: {backend: nonsense}\n", encoding="utf-8")
    assert main(["check", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "tts.backend" in err and "Traceback" not in err


# ---- start-up short form ---------------------------------------------------------------------------


async def test_health_shows_the_startup_checks(tiny_model: Path, voices_dir: Path, tmp_path: Path) -> None:
    overrides = {"tts": {"backend": "cosyvoice", "model_dir": str(tiny_model), "voices_dir": str(voices_dir)}}
    async with running_gateway(overrides) as gw, httpx.AsyncClient() as client:
        body = (await client.get(f"{gw.url}/v1/health")).json()
    checks = {check["name"]: check for check in body["checks"]}
    assert {"tts files", "tts llm.pt", "tts tokenizer", "tts campplus.onnx", "asr model"} <= set(checks)
    assert all(set(check) == {"name", "status", "detail", "fix"} for check in body["checks"])
    assert all(check["status"] in ("ok", "skipped") for check in body["checks"]), body["checks"]
    assert body["status"] == "ok"


async def test_startup_reports_a_problem_the_loader_tolerates(
    tiny_model: Path, voices_dir: Path, tmp_path: Path, caplog
) -> None:
    """Inputs are fed by position, so a renamed ONNX input still loads: start-up says so, health is degraded."""
    model = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    _rename_onnx_input(model)
    overrides = {"tts": {"backend": "cosyvoice", "model_dir": str(model), "voices_dir": str(voices_dir)}}
    caplog.set_level("INFO", logger="gateway.checks.model")
    async with running_gateway(overrides) as gw, httpx.AsyncClient() as client:
        body = (await client.get(f"{gw.url}/v1/health")).json()
    check = next(c for c in body["checks"] if c["name"] == "tts speech_tokenizer_v3.onnx")
    assert check["status"] == "failed" and "'speech', expected 'feats'" in check["detail"]
    assert TTS_FIX in check["fix"]
    assert body["status"] == "degraded"
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.checks.model"]
    assert any(m.startswith("model checks: ") and "1 failed" in m for m in logged), logged
    assert any("speech_tokenizer_v3.onnx failed" in m and "fix: " in m for m in logged), logged
