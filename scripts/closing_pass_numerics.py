"""How far ``engine.final_pass: streaming`` moves a sentence's last hop from the exact closing pass, against
the noise between two exact runs that only differ in what shares their batch.

    python scripts/closing_pass_numerics.py [--preset full] [--sentences 20] [--prompt-seconds 2]
                                            [--threads 2] [--model-dir DIR]

Random weights with the real architecture (``scripts.make_tiny_model``; ``full`` by default: the
Fun-CosyVoice3-0.5B dimensions, written once under ``models/.bench/``), fp32 on the CPU, one synthetic
voice with its prompt prefix cached as the engine caches it. ``--sentences`` sentences, half Chinese and
half English, from the traffic corpora of scripts/bench_traffic.py, each as many random speech tokens
(fixed seed) as it takes to say (random weights make any LLM output random anyway). Each sentence goes
through token2wav with the flow cache, hop by hop (25 + pad, 50, 100 tokens) to its closing call:

- ``exact``: the closing call upstream makes (full attention over prompt + every token, no cache), alone;
- ``streaming``: the closing call with the chunk mask, from the cached chunks (``final_pass: streaming``);
- ``exact-batched``: the exact closing call batched with the next sentence's (a different length), as
  the engine batches rows of one step: the same math, other batch companions.

The last hop's mel (the closing call's new frames) and waveform (its new samples) of ``streaming`` and of
``exact-batched`` are compared with ``exact``: max and RMS difference, and the RMS difference relative to
the last hop's own RMS. The summary prints the median and the largest over the sentences, and the decision
rule of issue 25: streaming may become the default only if its difference is within the batch noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from cosyvoice.flow.chunk_cache import FlowCacheManager  # noqa: E402
from cosyvoice.model import CosyVoice3  # noqa: E402
from cosyvoice.token2wav import SpeakerPrompt, Token2Wav, Token2WavStream  # noqa: E402
from scripts.bench_cosyvoice import synthetic_speaker  # noqa: E402
from scripts.bench_traffic import EN_SENTENCES, ZH_SENTENCES, tokens_for  # noqa: E402
from scripts.make_tiny_model import bench_model_dir  # noqa: E402
from tts_engine.backends.cosyvoice.flow_warm import warm_voice_prefix  # noqa: E402
from tts_engine.backends.cosyvoice.voices import PreparedVoice  # noqa: E402

CACHE_BYTES = 8 << 30


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=("tiny", "full"), default="full")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=20, help="half Chinese, half English")
    parser.add_argument("--prompt-seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def pick_sentences(count: int) -> list[str]:
    """``count`` sentences, Chinese and English in turn, from the traffic corpora (longest ones last)."""
    zh = sorted(ZH_SENTENCES, key=len)
    en = sorted(EN_SENTENCES, key=len)
    picked = []
    for i in range(count):
        corpus = zh if i % 2 == 0 else en
        picked.append(corpus[(i // 2 * len(corpus)) // max(1, (count + 1) // 2) % len(corpus)])
    return picked


def to_closing(t2w: Token2Wav, prompt: SpeakerPrompt, cache: FlowCacheManager, tokens: list[int], final_pass: str):
    """A stream of ``tokens`` run hop by hop up to its closing call (returned, not run) and its audio so far."""
    stream = t2w.stream(prompt, share_prompt=True, flow_cache=cache, final_pass=final_pass)
    stream.add_tokens(tokens)
    stream.end_input()
    audio = []
    while (job := stream.next_job()) is not None and not job.finalize:
        audio.extend(t2w.run([job]))
    return stream, audio


def closing(t2w: Token2Wav, streams: list[Token2WavStream]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run the closing calls of ``streams`` as one batch: each one's (new mel [80, m], new samples)."""
    jobs = [stream.next_job() for stream in streams]
    assert all(job is not None and job.finalize for job in jobs)
    mels_before = [stream.vocoder.mel for stream in streams]
    waves = t2w.run(jobs)  # type: ignore[arg-type]
    out = []
    for stream, before, wave in zip(streams, mels_before, waves, strict=True):
        mel = stream.vocoder.mel  # the closing call appends its frames (a final call trims nothing)
        new = mel if before is None else mel[:, before.shape[1] :]
        out.append((new.float().clone(), wave.float().clone()))
    return out


def compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """(max |a - b|, RMS of a - b, that RMS over the RMS of ``a``), over their common length."""
    n = min(a.shape[-1], b.shape[-1])
    diff = (a[..., :n] - b[..., :n]).double()
    rms = float(diff.pow(2).mean().sqrt())
    ref = float(a[..., :n].double().pow(2).mean().sqrt()) or 1.0
    return float(diff.abs().max()), rms, rms / ref


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = CosyVoice3.from_pretrained(bench_model_dir(args.preset, model_dir=args.model_dir), max_seconds=60)
    t2w = model.token2wav
    prompt = PreparedVoice(model, synthetic_speaker(model, args.prompt_seconds), None).flow_prompt
    cache = FlowCacheManager(CACHE_BYTES)
    warm_voice_prefix(t2w, prompt, cache)
    sentences = pick_sentences(args.sentences)
    generator = torch.Generator().manual_seed(args.seed)
    token_lists = [torch.randint(0, 6561, (tokens_for(s),), generator=generator).tolist() for s in sentences]
    print(
        f"preset={args.preset} device=cpu dtype=float32 threads={torch.get_num_threads()} prompt={args.prompt_seconds}s "
        f"sentences={len(sentences)} (zh and en in turn) seed={args.seed}; last hop = the closing call's new mel "
        "frames and samples; rel = RMS difference / RMS of the exact last hop"
    )
    header = f"{'#':>2} {'lang':>4} {'tokens':>6} {'what':>14} {'mel_max':>9} {'mel_rms':>9} {'mel_rel':>8} {'wav_max':>9} {'wav_rms':>9} {'wav_rel':>8}"
    print(header, flush=True)
    results: dict[str, list[tuple[float, ...]]] = {"streaming": [], "exact-batched": []}
    started = time.perf_counter()
    for pair in range(0, len(sentences) - 1, 2):  # a Chinese and an English sentence, batched together
        tokens = token_lists[pair : pair + 2]
        exact = [to_closing(t2w, prompt, cache, t, "exact")[0] for t in tokens]
        streaming = [to_closing(t2w, prompt, cache, t, "streaming")[0] for t in tokens]
        batched = [to_closing(t2w, prompt, cache, t, "exact")[0] for t in tokens]
        alone = [closing(t2w, [stream])[0] for stream in exact]
        stream_last = [closing(t2w, [stream])[0] for stream in streaming]
        together = closing(t2w, batched)  # the pair's exact closing calls as one batch
        for k in range(2):
            i = pair + k
            mel_e, wav_e = alone[k]
            for what, (mel, wav) in (("streaming", stream_last[k]), ("exact-batched", together[k])):
                row = compare(mel_e, mel) + compare(wav_e, wav)
                results[what].append(row)
                print(
                    f"{i:>2} {'zh' if i % 2 == 0 else 'en':>4} {len(tokens[k]):>6} {what:>14} {row[0]:>9.2e} "
                    f"{row[1]:>9.2e} {row[2]:>8.2%} {row[3]:>9.2e} {row[4]:>9.2e} {row[5]:>8.2%}",
                    flush=True,
                )
    print(f"({time.perf_counter() - started:.0f} s)")
    for what, rows in results.items():
        cols = list(zip(*rows, strict=True))
        print(
            f"{what:>14}: mel max {max(cols[0]):.2e} (median {statistics.median(cols[0]):.2e}), "
            f"mel RMS rel median {statistics.median(cols[2]):.2%} max {max(cols[2]):.2%}; "
            f"wave max {max(cols[3]):.2e} (median {statistics.median(cols[3]):.2e}), "
            f"wave RMS rel median {statistics.median(cols[5]):.2%} max {max(cols[5]):.2%}"
        )
    noise_mel, noise_wav = max(r[0] for r in results["exact-batched"]), max(r[3] for r in results["exact-batched"])
    within = all(r[0] <= noise_mel and r[3] <= noise_wav for r in results["streaming"])
    print(
        "decision: streaming is "
        + ("within" if within else "NOT within")
        + " the noise of exact runs on different batch compositions"
        + (": it may become the default" if within else ": keep final_pass exact (its closing pass runs off the critical path)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
