"""The activation measurement: the live-tensor tracker on known patterns, and the engine phases on a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cosyvoice.model import CosyVoice3
from scripts import activation_meters as meters
from scripts import measure_activations as ma
from scripts.make_tiny_model import make_model_dir

MIB = 1 << 20
PROMPT_SECONDS = 2.0  # 50 prompt tokens: a multiple of the 25-token first hop, so no prompt padding
FLOW_STEPS = 2  # the same peak as the model's 10 Euler steps, in a fifth of the time


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CosyVoice3:
    model_dir = make_model_dir(tmp_path_factory.mktemp("measure") / "tiny", "tiny", seed=0, onnx_models=False)
    return CosyVoice3.from_pretrained(model_dir, max_seconds=60)


@pytest.fixture(scope="module")
def peaks(model: CosyVoice3) -> dict[tuple[int, str], ma.PhasePeak]:
    results = ma.measure(model, [1, 2], prompt_seconds=PROMPT_SECONDS, steps=FLOW_STEPS)
    return {(r.rows, r.phase): r for r in results}


def test_tracker_gives_the_exact_peak_of_a_known_allocation_pattern() -> None:
    n = 128
    size = n * n * 4  # one [n, n] float32 tensor
    x, w, buf = torch.randn(n, n), torch.randn(n, n), torch.zeros(2 * n, n)  # baseline, never counted
    tracker = meters.LiveTensorTracker()
    with torch.inference_mode(), tracker:
        y = x @ w  # 1 S
        z = torch.tanh(y)  # 2 S
        assert tracker.current_bytes == 2 * size
        view = z[1:].t()  # a view shares z's storage: +0
        buf[:n].copy_(y)  # written into a baseline buffer: +0
        buf.mul_(2.0)  # in place on the baseline: +0
        assert tracker.current_bytes == 2 * size
        stacked = torch.stack([y, z, y])  # 5 S: the peak
        del stacked, y  # 1 S (z, kept alive through the view too)
        del z
        assert tracker.current_bytes == size  # the view still holds z's storage
        del view
        small = torch.ones(n)  # n * 4 bytes
    assert tracker.peak_bytes == 5 * size
    assert tracker.current_bytes == n * 4
    del small
    assert tracker.current_bytes == 0


def test_tracker_keeps_a_peak_per_phase_starting_from_what_is_live() -> None:
    n = 64
    size = n * n * 4
    tracker = meters.LiveTensorTracker()
    with torch.inference_mode(), tracker:
        tracker.phase("a")
        kept = torch.ones(n, n)
        tmp = torch.ones(n, n) * 3.0  # ones (freed at once) and the product
        del tmp
        tracker.phase("b")  # starts with `kept` live
        other = kept + 1.0
        del other
    assert tracker.phase_peaks["a"] == 3 * size  # kept, the temporary ones and the product
    assert tracker.phase_peaks["b"] == 2 * size
    del kept


def test_attention_scores_count_only_in_the_non_fused_peak() -> None:
    batch, heads, length, dim = 1, 2, 64, 8
    q = torch.randn(batch, heads, length, dim)
    tracker = meters.LiveTensorTracker()
    with torch.inference_mode(), tracker:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    out_bytes = out.numel() * 4
    scores = batch * heads * length * length * 4
    assert tracker.peak_bytes == out_bytes
    assert tracker.math_peak_bytes == 2 * scores


def test_sanity_pattern_matches_its_stated_peak() -> None:
    tracker = meters.LiveTensorTracker()
    expected_peak, expected_end = meters.sanity_pattern(tracker, n=64)
    assert (tracker.peak_bytes, tracker.current_bytes) == (expected_peak, expected_end)
    assert ma.main(["--sanity"]) == 0


def test_every_phase_has_a_positive_peak(peaks: dict[tuple[int, str], ma.PhasePeak]) -> None:
    assert {phase for _, phase in peaks} == set(ma.PHASES)
    for result in peaks.values():
        assert result.peak_bytes > 0
        assert result.math_peak_bytes is not None and result.math_peak_bytes >= result.peak_bytes


def test_peaks_grow_with_the_batch_rows(peaks: dict[tuple[int, str], ma.PhasePeak]) -> None:
    for phase in ("llm prefill", "flow", "vocoder"):
        one, two = peaks[(1, phase)].peak_bytes, peaks[(2, phase)].peak_bytes
        assert one < two <= 2 * one + MIB, phase


def test_the_measured_flow_hop_is_the_first_100_token_hop(
    model: CosyVoice3, peaks: dict[tuple[int, str], ma.PhasePeak]
) -> None:
    prompt_tokens = int(PROMPT_SECONDS * 25)
    # hops 25 and 50 are emitted; the flow runs over prompt + 75 + 100 tokens (look-ahead frames dropped)
    frames = model.config.token_mel_ratio * (prompt_tokens + 75 + 100)
    assert f"{frames} flow frames" in peaks[(1, "flow")].detail
    assert "100+3 tokens" in peaks[(1, "flow")].detail


def test_flow_steps_do_not_change_the_flow_peak_and_are_restored(model: CosyVoice3) -> None:
    flow = model.token2wav.flow
    speaker = ma.synthetic_speaker(model, 1.0)
    default_steps = flow.cfg.n_timesteps
    peaks = []
    for steps in (2, 3):
        with ma.flow_steps(flow, steps):
            assert flow.cfg.n_timesteps == steps
            peaks.append(ma.measure_hop(model, speaker, 1, 1)[0])
    assert flow.cfg.n_timesteps == default_steps
    assert peaks[0].phase == "flow" and peaks[0].peak_bytes == peaks[1].peak_bytes > 0
    with pytest.raises(ma.MeasureError), ma.flow_steps(flow, 0):
        pass


@pytest.mark.parametrize(
    "kwargs",
    [{"rows": [0]}, {"rows": []}, {"rows": [1], "hop_index": 0}, {"rows": [1], "prompt_seconds": 0.0}],
)
def test_bad_arguments_raise_a_measure_error(model: CosyVoice3, kwargs: dict) -> None:
    rows = kwargs.pop("rows")
    with pytest.raises(ma.MeasureError):
        ma.measure(model, rows, **kwargs)


def test_cuda_meter_refuses_a_cpu_device() -> None:
    with pytest.raises(ma.MeasureError):
        meters.CudaPeakMeter("cpu")


def test_main_prints_a_table_row_per_phase(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    argv = ["--model-dir", str(tmp_path / "tiny"), "--rows", "1", "--prompt-seconds", "1", "--hop-index", "2"]
    argv += ["--flow-steps", "2", "--threads", "1"]
    try:
        assert ma.main(argv) == 0
    finally:
        torch.set_num_threads(threads)  # the script sets the process-wide count
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.split()[:1] == ["1"]]
    assert [" ".join(row[1:3]) if row[1] == "llm" else row[1] for row in rows] == list(ma.PHASES)
    assert any(line.startswith("rows=1: worst phase") for line in lines)
