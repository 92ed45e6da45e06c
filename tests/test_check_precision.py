"""Reduced precision keeps the tiny model's LLM and flow close to fp32 (scripts/check_precision.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from scripts import check_precision
from scripts.make_tiny_model import make_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("precision") / "tiny"
    make_model_dir(path, "tiny", seed=0, onnx_models=False)
    return path


def test_bf16_and_fp16_stay_close_to_fp32(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = check_precision.main(["--model-dir", str(model_dir), "--tokens", "40"])
    assert [r.dtype for r in reports] == ["bfloat16", "float16"]
    for report in reports:
        assert report.finite and math.isfinite(report.wave_peak) and report.wave_peak > 0
        assert report.top1_agreement >= 0.9  # the same most likely speech token almost every step
        assert report.kl_mean < 0.01
        assert 0 < report.mel_rel_err < 0.05  # the flow's mel moves by well under 5 %
    bf16, fp16 = reports
    assert fp16.mel_rel_err < bf16.mel_rel_err  # 10 mantissa bits against 7
    out = capsys.readouterr().out
    assert "bfloat16" in out and "float16" in out and "mel_rel" in out


def test_unknown_dtype_is_refused(model_dir: Path) -> None:
    with pytest.raises(SystemExit):
        check_precision.main(["--model-dir", str(model_dir), "--dtypes", "int8"])
