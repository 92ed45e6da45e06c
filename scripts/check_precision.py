"""How far reduced precision (bf16 / fp16) moves CosyVoice3's outputs from fp32, on the same inputs.

    python scripts/check_precision.py [--model-dir DIR | --preset tiny|full] [--device cpu|cuda]
                                      [--dtypes bfloat16,float16] [--tokens 100] [--threads N]

For each reduced dtype it loads the model again in that dtype and compares with fp32:

- LLM: speech tokens are sampled once in fp32 (``--tokens`` of them, stops masked), then both models score
  the same sequence teacher-forced: the largest log-prob difference, the mean KL(fp32 || dtype) per step,
  and how often the two agree on the most likely token.
- token2wav: both turn the same tokens into a waveform (offline, full attention): the log-spectral
  distance between the two (dB, phase-blind: the vocoder's sine source integrates F0, so a tiny F0
  difference drifts the phase and a sample-wise SNR says little), the sample-wise SNR, the reduced
  waveform's peak, and whether every sample is finite (fp16 overflow shows here).

- flow: the mel of that offline call, as mean absolute difference (log-mel units) and relative error.

Read the waveform figures with care on random weights: a random vocoder is chaotic (in fp32, 0.1 % noise
on its input mel already gives about 5.7 dB of log-spectral distance on the tiny model), so there the
LLM and mel figures are the ones that measure the precision.

Without ``--model-dir`` a random-weight model of ``--preset`` is written under ``models/.bench/`` (as
scripts/bench_engine.py does). Random weights show whether the numerics hold together (no overflow, errors
of the expected size); whether a voice still sounds the same needs the real weights and a listener.
Imports only torch / numpy / tokenizers / safetensors / pyyaml / onnxruntime.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from cosyvoice.frontend.speaker import SpeakerRecord  # noqa: E402
from cosyvoice.llm import LLMPrompt, generate  # noqa: E402
from cosyvoice.model import CosyVoice3  # noqa: E402
from scripts.bench_cosyvoice import synthetic_speaker  # noqa: E402
from scripts.make_tiny_model import bench_model_dir  # noqa: E402

TEXT = "今天天气很好，我们一起去公园散步吧。"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(frozen=True)
class PrecisionReport:
    dtype: str
    logp_max_abs_diff: float
    kl_mean: float
    top1_agreement: float  # share of steps where both models rank the same token first
    mel_mean_abs_diff: float  # flow output, log-mel units
    mel_rel_err: float  # ||fp32 - reduced|| / ||fp32|| of the flow's mel
    wave_lsd_db: float
    wave_snr_db: float
    wave_peak: float
    finite: bool


def sample_tokens(model: CosyVoice3, speaker: SpeakerRecord, num_tokens: int) -> tuple[LLMPrompt, list[int]]:
    """A fixed-length fp32 token sequence for the first segment of ``TEXT`` (stops masked until the end)."""
    prompt = model.build_llm_prompt(model.text_segments(TEXT)[0], speaker, "zero_shot")
    request = model.new_llm_request(prompt, generator=torch.Generator().manual_seed(0))
    request.lengths = dataclasses.replace(request.lengths, mask_all_stops_before_min=True)
    request.min_len = request.max_len = num_tokens
    return prompt, list(generate(model.llm, request))


def log_spectral_distance(reference: torch.Tensor, other: torch.Tensor, n_fft: int = 1024) -> float:
    """Mean over frames of the RMS difference of the two power spectra in dB (phase-blind)."""
    window = torch.hann_window(n_fft)
    spectra = [
        torch.stft(w, n_fft, hop_length=n_fft // 4, window=window, return_complex=True).abs().pow(2) + 1e-10
        for w in (reference, other)
    ]  # each [F, frames]
    diff_db = 10 * torch.log10(spectra[0] / spectra[1])
    return diff_db.pow(2).mean(0).sqrt().mean().item()


def offline_mel_and_wave(
    model: CosyVoice3, speaker: SpeakerRecord, tokens: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The flow's mel [80, m] (fp32, CPU) and the waveform of one offline token2wav call."""
    stream = model.token2wav.stream(model.speaker_prompt(speaker), stream=False)
    mels: list[torch.Tensor] = []
    apply = stream._apply
    stream._apply = lambda job, mel: mels.append(mel[0].float().cpu()) or apply(job, mel)  # type: ignore[method-assign]
    stream.add_tokens(tokens)
    wave = torch.cat([c.float().cpu() for c in stream.finish()])
    return torch.cat(mels, dim=-1), wave


def compare(
    reference: CosyVoice3, reduced: CosyVoice3, speaker: SpeakerRecord, num_tokens: int, dtype: str
) -> PrecisionReport:
    prompt, tokens = sample_tokens(reference, speaker, num_tokens)
    want = reference.llm.forward_logp(prompt, tokens).float().cpu()  # [T + 1, V]
    got = reduced.llm.forward_logp(prompt, tokens).float().cpu()
    finite_rows = torch.isfinite(want) & torch.isfinite(got)
    diff = (want - got).abs().masked_fill(~finite_rows, 0.0)
    kl = (want.exp() * (want - got)).masked_fill(~finite_rows, 0.0).sum(-1)  # [T + 1]
    top1 = (want.argmax(-1) == got.argmax(-1)).float().mean().item()

    ref_mel, ref_wave = offline_mel_and_wave(reference, speaker, tokens)
    red_mel, red_wave = offline_mel_and_wave(reduced, speaker, tokens)
    finite = bool(torch.isfinite(red_wave).all())
    noise = (ref_wave - red_wave).pow(2).mean().item()
    signal = ref_wave.pow(2).mean().item()
    snr = 10 * math.log10(signal / noise) if noise > 0 and finite else (math.inf if finite else -math.inf)
    return PrecisionReport(
        mel_mean_abs_diff=(ref_mel - red_mel).abs().mean().item(),
        mel_rel_err=((ref_mel - red_mel).norm() / ref_mel.norm()).item(),
        wave_lsd_db=log_spectral_distance(ref_wave, red_wave) if finite else math.nan,
        dtype=dtype,
        logp_max_abs_diff=diff.max().item(),
        kl_mean=kl.mean().item(),
        top1_agreement=top1,
        wave_snr_db=snr,
        wave_peak=red_wave.abs().max().item() if finite else math.nan,
        finite=finite and bool(torch.isfinite(got).any(-1).all()),
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--preset", choices=("tiny", "full"), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", default="bfloat16,float16", help="comma-separated: bfloat16, float16")
    parser.add_argument("--tokens", type=int, default=100, help="speech tokens to compare (25 = 1 s)")
    parser.add_argument("--prompt-seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    unknown = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if unknown:
        parser.error(f"unknown dtype(s) {unknown}; choose from {', '.join(DTYPES)}")
    if args.tokens < 1:
        parser.error("--tokens must be >= 1")
    return args


def main(argv: list[str] | None = None) -> list[PrecisionReport]:
    args = _parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = bench_model_dir(args.preset, model_dir=args.model_dir)
    device = torch.device(args.device)
    reference = CosyVoice3.from_pretrained(model_dir, device=device, dtype=torch.float32, max_seconds=60)
    speaker = synthetic_speaker(reference, args.prompt_seconds)
    print(f"model={model_dir} device={device} tokens={args.tokens} (fp32 reference)")
    print(
        f"{'dtype':<9} {'logp_max_diff':>13} {'kl_mean':>9} {'top1_%':>7} {'mel_abs':>8} {'mel_rel':>8} {'lsd_dB':>7} {'snr_dB':>7} {'peak':>6} finite"
    )
    reports = []
    for name in args.dtypes.split(","):
        reduced = CosyVoice3.from_pretrained(model_dir, device=device, dtype=DTYPES[name], max_seconds=60)
        report = compare(reference, reduced, speaker, args.tokens, name)
        reports.append(report)
        print(
            f"{name:<9} {report.logp_max_abs_diff:>13.4f} {report.kl_mean:>9.5f} "
            f"{100 * report.top1_agreement:>7.1f} {report.mel_mean_abs_diff:>8.4f} {report.mel_rel_err:>8.4f} "
            f"{report.wave_lsd_db:>7.2f} {report.wave_snr_db:>7.1f} {report.wave_peak:>6.3f} "
            f"{'yes' if report.finite else 'NO'}",
            flush=True,
        )
        del reduced
    return reports


if __name__ == "__main__":
    main()
    sys.exit(0)
