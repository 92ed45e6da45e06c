"""Measured activation peak per batch row of the CosyVoice3 engine, against the memory plan's reserve.

    python scripts/measure_activations.py [--preset tiny|full] [--rows 1,2,4] [--prompt-seconds 10]
        [--hop-index 3] [--flow-steps N] [--threads N] [--device cpu|cuda] [--dtype float32|float16|bfloat16]
        [--model-dir DIR] [--top K] [--sanity]

``tts_engine.memory`` reserves ``estimate_activation_bytes_per_row`` bytes per batch row. This measures the
peak above the baseline (weights, KV cache, inputs: all allocated before the measured call) of the phases
an engine step runs one after the other, for ``--rows`` streams sharing one ``--prompt-seconds`` synthetic
speaker (random weights, no ONNX frontend): ``llm prefill`` / ``llm decode`` (one batched
:class:`cosyvoice.llm.LLMRunner` zero-shot prefill, then one decode step); ``flow``, one batched streaming
hop through :meth:`cosyvoice.token2wav.Token2Wav.run`, by default hop 3 = the first 100-token hop plus 3
look-ahead tokens (hops 1-2 run first, untracked; the flow recomputes from the prompt every hop, so hop 4,
5, ... are 200 frames longer each); ``vocoder``, the same hop's HiFT call (split at its forward pre-hook).

CPU (default): a ``TorchDispatchMode`` adds the bytes of every storage an op creates and subtracts them
when the storage dies (``weakref.finalize`` on the storage object, which torch keeps exactly as long as the
storage), keeping the maximum. Outputs aliasing an argument (views, in-place, ``out=``) add nothing, so a
write into the KV cache is not counted. Composite ops are decomposed (``OpOverload.decompose``) so their
intermediates are seen, as in real execution; kernel-internal workspace is not. ``--sanity`` checks the
tracker on a known pattern next to ``torch.distributed._tools.mem_tracker.MemTracker``, which counts a
write into a preexisting buffer as a new activation (the KV cache would show up as activations).

Attention: ``F.scaled_dot_product_attention`` is one op here (its output only). That is what CUDA's fused
kernels allocate (flash / memory-efficient; the flow's additive mask selects memory-efficient) and what
this torch's CPU kernel does (``torch._fused_sdp_choice`` picks flash for our shapes): none materialises
the [B, heads, Tq, Tk] scores. A non-fused ("math") kernel holds two score tensors at once; the
``math_MiB/row`` column adds them, an upper bound for a GPU that falls back to it. Masks (the flow's
additive [1 or 2B, 1, T, T], the LLM's bool [B, 1, T, K]) are ordinary tensors and are counted.

GPU: ``--device cuda`` measures ``torch.cuda.max_memory_allocated`` above ``memory_allocated`` at the start
of the same calls (peak stats reset per phase), the real peak with kernel workspace and allocator rounding::

    python scripts/measure_activations.py --device cuda --preset full --rows 1,2,4,8,16 --prompt-seconds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from cosyvoice.llm import LLMRequest, LLMRunner  # noqa: E402
from cosyvoice.model import CosyVoice3  # noqa: E402
from cosyvoice.token2wav import Token2WavStream  # noqa: E402
from scripts.activation_meters import MeasureError, make_meter, run_sanity  # noqa: E402
from scripts.bench_cosyvoice import TEXT, hop_plan, synthetic_speaker  # noqa: E402
from scripts.make_tiny_model import bench_model_dir  # noqa: E402
from tts_engine.memory import estimate_activation_bytes_per_row  # noqa: E402

__all__ = ["MeasureError", "PhasePeak", "measure"]

MIB = 1 << 20
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PHASES = ("llm prefill", "llm decode", "flow", "vocoder")


@dataclass(frozen=True, slots=True)
class PhasePeak:
    """Peak bytes above the baseline of one phase at one batch size."""

    rows: int
    phase: str
    peak_bytes: int
    math_peak_bytes: int | None  # peak if SDPA materialised its scores (CPU tracker only)
    detail: str  # shapes that set the size of the phase (frames, samples, positions)
    top: tuple[tuple[int, str], ...] = ()  # (bytes, "op shape dtype") of the largest live tensors at the peak


@contextmanager
def flow_steps(flow: torch.nn.Module, steps: int | None) -> Iterator[None]:
    """Run the flow with ``steps`` Euler steps (None: unchanged). Each step frees its transient tensors
    before the next one starts, so any count >= 2 gives the same peak (checked on the tiny model: 2 and 10
    steps agree to the byte; 1 step is lower, its input being a view of the noise) in a fifth of the time."""
    if steps is None:
        yield
        return
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise MeasureError(f"flow steps must be an int >= 1, got {steps!r}")
    saved = flow.cfg
    flow.cfg = dataclasses.replace(saved, n_timesteps=steps)
    try:
        yield
    finally:
        flow.cfg = saved


@contextmanager
def _phase_on_forward(module: torch.nn.Module, meter, name: str) -> Iterator[None]:
    """Switch ``meter`` to phase ``name`` when ``module`` is called."""
    handle = module.register_forward_pre_hook(lambda *_: meter.phase(name))
    try:
        yield
    finally:
        handle.remove()


def _llm_requests(model: CosyVoice3, prompt, rows: int) -> list[LLMRequest]:
    lengths = dataclasses.replace(model.lengths, mask_all_stops_before_min=True)  # no stop at prefill
    return [
        LLMRequest(prompt, generator=torch.Generator().manual_seed(row), ras=model.ras, lengths=lengths)
        for row in range(rows)
    ]


def measure_llm(model: CosyVoice3, speaker, rows: int, keep_top: int = 0) -> list[PhasePeak]:
    """Peaks of one batched prefill and one decode step of ``rows`` zero-shot requests."""
    prompt = model.build_llm_prompt(model.text_segments(TEXT)[0], speaker, "zero_shot")
    warm = _llm_requests(model, prompt, 1)  # untracked: lazily built tables become baseline
    warm_runner = LLMRunner(model.llm, max_batch=1, max_len=warm[0].num_cache_positions)
    warm_runner.prefill(warm)
    warm_runner.decode_step(warm)
    del warm_runner
    requests = _llm_requests(model, prompt, rows)
    runner = LLMRunner(model.llm, max_batch=rows, max_len=max(r.num_cache_positions for r in requests))
    device = model.llm.speech_embedding.weight.device
    with make_meter(device, keep_top) as meter:
        meter.phase("llm prefill")
        runner.prefill(requests)
        meter.phase("llm decode")
        runner.decode_step(requests)
    positions = f"{requests[0].num_prefix_tokens} prefix positions"
    return _peaks(meter, rows, {"llm prefill": positions, "llm decode": positions})


def measure_hop(model: CosyVoice3, speaker, rows: int, hop_index: int, keep_top: int = 0) -> list[PhasePeak]:
    """Peaks of the flow and the vocoder of streaming hop ``hop_index`` (1-based) of ``rows`` streams."""
    t2w = model.token2wav
    prompt = model.speaker_prompt(speaker)
    num_prompt = int(prompt.prompt_token.shape[0])
    plan = hop_plan(model, num_prompt, hop_index)
    needed = plan[-1][0] + plan[-1][1] + t2w.schedule.lookahead
    gen = torch.Generator().manual_seed(5)
    streams: list[Token2WavStream] = []
    for _ in range(rows):
        stream = t2w.stream(prompt)
        stream.add_tokens(torch.randint(0, t2w.vocab_size, (needed,), generator=gen))
        streams.append(stream)
    warm = t2w.stream(prompt)  # untracked: caches built lazily on a first call (noise copy, schedule)
    warm.add_tokens(torch.randint(0, t2w.vocab_size, (needed,), generator=gen))
    t2w.run([warm.next_job()])
    for _ in range(hop_index - 1):  # earlier hops, untracked
        t2w.run([stream.next_job() for stream in streams])
    jobs = [stream.next_job() for stream in streams]
    if any(job is None or job.finalize for job in jobs):
        raise MeasureError(f"hop {hop_index} is not a streaming hop of this schedule")
    flow_frames = t2w.token_mel_ratio * (num_prompt + jobs[0].num_tokens - t2w.schedule.lookahead)
    voc = streams[0].vocoder
    emitted = voc.speech_offset // voc.samples_per_frame
    window_start = 0 if voc.context_frames is None else max(0, emitted - voc.context_frames)
    with make_meter(t2w.flow.input_embedding.weight.device, keep_top) as meter:
        with _phase_on_forward(t2w.hift, meter, "vocoder"):
            meter.phase("flow")
            t2w.run(jobs)
    if "vocoder" not in meter.phase_peaks:
        raise RuntimeError("the vocoder's forward pre-hook never fired: cannot split flow and vocoder")
    hop = f"hop {hop_index}: {plan[-1][1]}+{t2w.schedule.lookahead} tokens"
    window = voc.total_frames - window_start
    return _peaks(
        meter,
        rows,
        {"flow": f"{hop}, {flow_frames} flow frames", "vocoder": f"{hop}, {window} mel frames windowed"},
    )


def _peaks(meter, rows: int, details: dict[str, str]) -> list[PhasePeak]:
    tops = getattr(meter, "phase_top", {})
    peaks, maths = meter.phase_peaks, meter.phase_math_peaks
    return [PhasePeak(rows, k, peaks[k], maths.get(k), d, tuple(tops.get(k, ()))) for k, d in details.items()]


def measure(
    model: CosyVoice3,
    rows: Sequence[int],
    *,
    prompt_seconds: float = 10.0,
    hop_index: int = 3,
    keep_top: int = 0,
    steps: int | None = None,
    log: Callable[[str], None] | None = None,
) -> list[PhasePeak]:
    """Peaks of every phase for each batch size in ``rows`` (LLM, flow hop, vocoder); ``keep_top`` > 0 also
    records the largest tensors live at each peak (CPU tracker only); ``steps`` sets the flow's Euler steps
    (see :func:`flow_steps`); ``log`` gets a line after each measurement."""
    if not rows or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in rows):
        raise MeasureError(f"rows must be positive ints, got {list(rows)!r}")
    if not prompt_seconds > 0:
        raise MeasureError(f"prompt_seconds must be > 0, got {prompt_seconds!r}")
    if isinstance(hop_index, bool) or not isinstance(hop_index, int) or hop_index < 1:
        raise MeasureError(f"hop_index must be an int >= 1, got {hop_index!r}")
    speaker = synthetic_speaker(model, prompt_seconds)
    results: list[PhasePeak] = []
    for n in rows:
        results += measure_llm(model, speaker, n, keep_top)
        if log:
            log(f"rows={n}: llm done")
        with flow_steps(model.token2wav.flow, steps):
            results += measure_hop(model, speaker, n, hop_index, keep_top)
        if log:
            log(f"rows={n}: flow hop and vocoder done")
    return results


def print_table(results: Sequence[PhasePeak], estimate: int) -> None:
    print(f"{'rows':>4}  {'phase':<12} {'peak_MiB':>9} {'MiB/row':>8} {'math_MiB/row':>12} ", end="")
    print(f"{'est_MiB/row':>11} {'meas/est':>8}  detail")
    for r in results:
        per_row = r.peak_bytes / r.rows
        math = "-" if r.math_peak_bytes is None else f"{r.math_peak_bytes / r.rows / MIB:.1f}"
        print(
            f"{r.rows:>4}  {r.phase:<12} {r.peak_bytes / MIB:>9.1f} {per_row / MIB:>8.1f} {math:>12} "
            f"{estimate / MIB:>11.1f} {per_row / estimate:>8.2f}  {r.detail}"
        )
    by_rows = sorted({r.rows for r in results})
    for phase in PHASES:
        pts = {r.rows: r.peak_bytes for r in results if r.phase == phase}
        if len(by_rows) > 1 and len(pts) == len(by_rows):
            lo, hi = by_rows[0], by_rows[-1]
            slope = (pts[hi] - pts[lo]) / (hi - lo)
            print(f"marginal {phase:<12} {slope / MIB:8.1f} MiB per added row (rows {lo} -> {hi})")
    for n in by_rows:
        worst = max((r for r in results if r.rows == n), key=lambda r: r.peak_bytes)
        need = worst.peak_bytes / n
        print(
            f"rows={n}: worst phase {worst.phase} {worst.peak_bytes / MIB:.1f} MiB = {need / MIB:.1f} MiB/row; "
            f"plan reserves {n * estimate / MIB:.1f} MiB ({'covers' if need <= estimate else 'SHORT'})"
        )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=("tiny", "full"), default="tiny")
    parser.add_argument("--rows", default="1,2,4", help="comma-separated batch sizes")
    parser.add_argument("--prompt-seconds", type=float, default=10.0)
    parser.add_argument("--hop-index", type=int, default=3, help="hop measured (3: first 100-token hop)")
    parser.add_argument("--device", default="cpu", help="cpu (live-tensor tracker) or cuda (allocator peak)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--flow-steps", type=int, default=None, help="flow Euler steps (>= 2: same peak)")
    parser.add_argument("--top", type=int, default=0, help="list the K largest tensors at each peak")
    parser.add_argument("--sanity", action="store_true", help="only check the trackers on a known pattern")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sanity:
        return 0 if run_sanity() else 1
    try:
        rows = [int(n) for n in args.rows.split(",") if n.strip()]
    except ValueError as exc:
        raise MeasureError(f"--rows must be comma-separated ints, got {args.rows!r}") from exc
    start = time.perf_counter()
    model = CosyVoice3.from_pretrained(
        bench_model_dir(args.preset, model_dir=args.model_dir),
        device=torch.device(args.device),
        dtype=DTYPES[args.dtype],
        max_seconds=60,
    )
    estimate = estimate_activation_bytes_per_row(model, DTYPES[args.dtype].itemsize)
    print(
        f"preset={args.preset} device={args.device} dtype={args.dtype} prompt={args.prompt_seconds}s "
        f"threads={torch.get_num_threads()} torch={torch.__version__} "
        f"flow_steps={args.flow_steps or model.token2wav.flow.cfg.n_timesteps} "
        f"estimate_activation_bytes_per_row={estimate / MIB:.1f} MiB"
    )
    results = measure(
        model,
        rows,
        prompt_seconds=args.prompt_seconds,
        hop_index=args.hop_index,
        keep_top=args.top,
        steps=args.flow_steps,
        log=lambda line: print(f"[{time.perf_counter() - start:.0f} s] {line}", file=sys.stderr, flush=True),
    )
    print_table(results, estimate)
    for r in results:
        if r.top and r.rows == max(rows):
            print(f"largest live tensors at the {r.phase} peak, rows={r.rows}:")
            for nbytes, origin in r.top:
                print(f"  {nbytes / MIB:9.2f} MiB  {origin}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
