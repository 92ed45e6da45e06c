"""Per-stage timing of CosyVoice3 inference at full size (random weights), one stream.

    python scripts/bench_cosyvoice.py [--device cpu|cuda] [--dtype float32|float16|bfloat16]
                                      [--threads N] [--quick] [--model-dir DIR] [--seed N]

Writes (once) a random-weight model with the Fun-CosyVoice3-0.5B-2512 dimensions to ``--model-dir``
(default ``models/.bench/full-seed<seed>``, git-ignored; about 3.4 GB) and reuses it afterwards. Then,
with a synthetic speaker (``--prompt-seconds`` of prompt tokens/mel, random x-vector), it times:

* LLM prefill of a zero-shot prompt and LLM decode per token (batch 1, RAS sampling included);
* the flow per streaming hop (first hop 25 + pad tokens, then 50, then 100; chunk-masked, 3 look-ahead
  tokens, recomputed from the prompt on every hop as upstream does) and the windowed HiFT per hop;
* first-chunk latency = prefill + the decode steps for the first hop's tokens + flow hop 1 + HiFT hop 1.

Each figure is also given per second of audio produced (25 tokens = 1 s). ``--quick`` times a few decode
steps and the first hop only. Then the flow of the first hop with a ``--cache-prompt-seconds`` (10 s)
prompt, flow chunk cache off (the prompt's chunks recomputed, as upstream) and on (the voice's prompt
chunks taken from the cache, cosyvoice/flow/chunk_cache.py), in the same run, ``--cache-repeats`` runs
of each interleaved, best wall and CPU time of each, with the largest difference of their mels. Imports only torch / numpy / tokenizers / safetensors / pyyaml /
onnxruntime through ``cosyvoice`` and ``scripts.make_tiny_model`` (no ``onnx`` needed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from cosyvoice.flow.chunk_cache import FlowCacheManager  # noqa: E402
from cosyvoice.frontend.speaker import SpeakerRecord  # noqa: E402
from cosyvoice.hift import HiftStreamState  # noqa: E402
from cosyvoice.llm import LLMPrompt, LLMRunner  # noqa: E402
from cosyvoice.model import CosyVoice3  # noqa: E402
from cosyvoice.text.prompt import zero_shot_prompt  # noqa: E402
from scripts.make_tiny_model import bench_model_dir  # noqa: E402

TOKENS_PER_SECOND = 25
TRANSCRIPT = "This is the prompt recording that the benchmark pretends to have."
TEXT = (
    "Streaming text to speech needs a short first chunk, so every stage of the pipeline is timed "
    "separately for one request."
)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--quick", action="store_true", help="a few decode steps and the first hop only")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0, help="weights seed of the generated model")
    parser.add_argument("--prompt-seconds", type=float, default=3.2, help="speaker prompt length")
    parser.add_argument("--text-tokens", type=int, default=30, help="tts text tokens of the LLM prompt")
    parser.add_argument("--decode-tokens", type=int, default=None, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs per stage (cuda: 1)")
    parser.add_argument("--cache-prompt-seconds", type=float, default=10.0, help="prompt of the cache figure")
    parser.add_argument(
        "--cache-repeats",
        type=int,
        default=3,
        help="interleaved off/on runs of the cache figure (best of each)",
    )
    return parser.parse_args(argv)


class Timer:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], object]) -> tuple[float, object]:
        self.sync()
        start = time.perf_counter()
        result = fn()
        self.sync()
        return time.perf_counter() - start, result


def synthetic_speaker(model: CosyVoice3, seconds: float) -> SpeakerRecord:
    gen = torch.Generator().manual_seed(1234)
    tokens = int(seconds * TOKENS_PER_SECOND)
    ids = model.tokenizer.encode(zero_shot_prompt(TRANSCRIPT))
    return SpeakerRecord(
        prompt_text_tokens=torch.tensor(ids, dtype=torch.int32),
        prompt_speech_tokens=torch.randint(0, 6561, (tokens,), generator=gen, dtype=torch.int32),
        prompt_mel=torch.randn(2 * tokens, 80, generator=gen) * 2.0 - 5.0,
        embedding=torch.randn(192, generator=gen),
        prompt_text=TRANSCRIPT,
    )


def time_llm(
    model: CosyVoice3, speaker: SpeakerRecord, timer: Timer, steps: int, warmup: int, text_tokens: int
):
    """(prefix positions, median prefill seconds of 3 timed runs, per-step decode seconds of the last)."""
    repeats = warmup + 3
    full = model.build_llm_prompt(model.text_segments(TEXT)[0], speaker, "zero_shot")
    prompt = LLMPrompt.zero_shot(full.text[:text_tokens], full.prompt_text, full.prompt_speech)
    prefill_times: list[float] = []
    for run in range(repeats):
        request = model.new_llm_request(prompt, generator=torch.Generator().manual_seed(run))
        runner = LLMRunner(model.llm, max_batch=1, max_len=request.num_cache_positions)
        seconds, _ = timer(lambda runner=runner, request=request: runner.prefill([request]))
        if run >= warmup:
            prefill_times.append(seconds)
        step_times = []
        while run == repeats - 1 and len(step_times) < steps and not request.finished:
            dt, _ = timer(lambda runner=runner, request=request: runner.decode_step([request]))
            step_times.append(dt)
        runner.abort(request)
    return request.num_prefix_tokens, statistics.median(prefill_times), step_times


def hop_plan(model: CosyVoice3, num_prompt: int, hops: int) -> list[tuple[int, int]]:
    """(token_offset, hop tokens) of the first ``hops`` streaming hops."""
    schedule = model.token2wav.schedule
    plan, offset, hop = [], 0, schedule.first_hop
    for _ in range(hops):
        this_hop = hop + (schedule.prompt_pad(num_prompt) if offset == 0 else 0)
        plan.append((offset, this_hop))
        offset += this_hop
        hop = min(schedule.max_hop, hop * schedule.scale)
    return plan


def time_token2wav(model: CosyVoice3, speaker: SpeakerRecord, timer: Timer, hops: int, warmup: int):
    prompt = model.speaker_prompt(speaker)
    flow, hift = model.token2wav.flow, model.token2wav.hift
    device = flow.input_embedding.weight.device
    num_prompt = int(prompt.prompt_token.shape[0])
    plan = hop_plan(model, num_prompt, hops)
    lookahead = model.token2wav.schedule.lookahead
    total = plan[-1][0] + plan[-1][1] + lookahead
    tokens = torch.randint(0, 6561, (1, total), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    results = []
    for run in range(warmup + 1):
        state = HiftStreamState(hift, context_frames=model.token2wav.hift_context_frames)
        rows = []
        for offset, hop in plan:
            num = offset + hop + lookahead

            def flow_call(num: int = num, offset: int = offset) -> torch.Tensor:
                mel = flow.inference(
                    tokens[:, :num].to(device),
                    [num],
                    prompt.prompt_token[None].to(device),
                    [num_prompt],
                    prompt.prompt_feat[None].to(device),
                    [prompt.prompt_feat.shape[0]],
                    prompt.embedding[None].to(device),
                    streaming=True,
                    finalize=False,
                )  # [1, 80, M]
                end = flow.mel_lengths([num], [num_prompt], [prompt.prompt_feat.shape[0]], False)[0]
                return mel[:, :, 2 * offset : end]

            flow_s, mel = timer(flow_call)
            hift_s, wave = timer(lambda mel=mel, state=state: state.push(hift, mel, finalize=False))
            rows.append((hop, flow_s, hift_s, int(wave.numel())))
        results = rows
        if run < warmup:
            print(f"  (warm-up run {run + 1} done)", flush=True)
    return num_prompt, results


def time_flow_cache(model: CosyVoice3, timer: Timer, seconds: float, warmup: int, repeats: int) -> None:
    """Flow time of the first streaming hop with a ``seconds`` prompt, cache off and on."""
    speaker = synthetic_speaker(model, seconds)
    prompt = model.speaker_prompt(speaker)
    flow = model.token2wav.flow
    device = flow.input_embedding.weight.device
    num_prompt = int(prompt.prompt_token.shape[0])
    ((offset, hop),) = hop_plan(model, num_prompt, 1)
    num = offset + hop + model.token2wav.schedule.lookahead
    tokens = torch.randint(0, 6561, (1, num), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    args = (
        tokens.to(device), [num], prompt.prompt_token[None].to(device), [num_prompt],
        prompt.prompt_feat[None].to(device), [prompt.prompt_feat.shape[0]], prompt.embedding[None].to(device),
    )  # fmt: skip
    manager = FlowCacheManager(1 << 40)

    def hop_call(cache: object | None) -> torch.Tensor:
        extra = {} if cache is None else {"caches": [cache], "skip_frames": [0]}
        return flow.inference(*args, streaming=True, finalize=False, **extra)

    for _ in range(warmup):
        hop_call(None)
    fill_s, _ = timer(lambda: hop_call(manager.stream_cache(prompt)))  # the voice's first stream fills it
    for _ in range(warmup):
        hop_call(manager.stream_cache(prompt))
    # Off and on alternate, and each keeps its best run (wall and CPU time): on a shared machine a
    # load spike then slows one run, not one whole mode (timeit's advice: the minimum is the figure).
    runs: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    mels: dict[str, torch.Tensor] = {}
    for _ in range(max(1, repeats)):
        for mode in ("off", "on"):
            cpu_start = time.process_time()
            wall_s, mels[mode] = timer(
                lambda mode=mode: hop_call(None if mode == "off" else manager.stream_cache(prompt))
            )
            runs[mode].append((wall_s, time.process_time() - cpu_start))
    (off_s, off_cpu), (on_s, on_cpu) = (
        (min(w for w, _ in runs[m]), min(c for _, c in runs[m])) for m in ("off", "on")
    )
    voice_frames = manager.voice_bytes and manager._voices[id(prompt)].segments[-1].end
    print(
        f"\nflow, first hop ({hop} + 3 tokens) with a {seconds:.0f} s prompt ({num_prompt} tokens, "
        f"{2 * num_prompt} frames; {voice_frames} cached as the voice's prefix, "
        f"{manager.voice_bytes / (1 << 20):.0f} MiB), best of {len(runs['off'])} interleaved runs each:"
    )
    print(f"  cache off {1000 * off_s:8.1f} ms wall, {1000 * off_cpu:8.1f} ms CPU   "
          f"(the voice's first stream, filling the cache: {1000 * fill_s:.1f} ms)")  # fmt: skip
    print(f"  cache on  {1000 * on_s:8.1f} ms wall, {1000 * on_cpu:8.1f} ms CPU   "
          f"= {off_s / on_s:.2f}x less wall time, {off_cpu / on_cpu:.2f}x less CPU time; "
          f"max |mel on - mel off| = {(mels['on'] - mels['off']).abs().max().item():.2e}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    warmup = args.warmup if args.warmup is not None else (1 if device.type == "cuda" else 0)
    steps = args.decode_tokens or (8 if args.quick else 50)
    hops = 1 if args.quick else 3
    model_dir = bench_model_dir("full", args.seed, args.model_dir)
    timer = Timer(device)
    load_s, model = timer(
        lambda: CosyVoice3.from_pretrained(model_dir, device=device, dtype=DTYPES[args.dtype], max_seconds=60)
    )
    speaker = synthetic_speaker(model, args.prompt_seconds)
    print(
        f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
        f"dtype {args.dtype}, torch threads {torch.get_num_threads()}, torch {torch.__version__}, "
        f"load {load_s:.1f} s, warm-up runs {warmup}"
    )
    prefix, prefill_s, step_times = time_llm(model, speaker, timer, steps, warmup, args.text_tokens)
    per_token = statistics.median(step_times)
    print(f"\nLLM  prefill ({prefix} positions), median of 3: {1000 * prefill_s:8.1f} ms")
    print(
        f"LLM  decode, batch 1, median of {len(step_times)} steps: {1000 * per_token:8.1f} ms/token"
        f"  = {per_token * TOKENS_PER_SECOND:6.2f} s per s of audio"
    )
    num_prompt, rows = time_token2wav(model, speaker, timer, hops, warmup)
    print(
        f"\nflow + HiFT per streaming hop (prompt {num_prompt} tokens; flow recomputes prompt + all tokens):"
    )
    print(
        f"{'hop tokens':>10} {'flow ms':>9} {'s/s audio':>9} {'HiFT ms':>9} {'s/s audio':>9} {'samples':>8}"
    )
    for hop, flow_s, hift_s, samples in rows:
        audio_s = hop / TOKENS_PER_SECOND
        print(
            f"{hop:>10} {1000 * flow_s:9.1f} {flow_s / audio_s:9.3f} {1000 * hift_s:9.1f} "
            f"{hift_s / audio_s:9.3f} {samples:>8}"
        )
    first_hop, flow1, hift1, samples1 = rows[0]
    lookahead = model.token2wav.schedule.lookahead
    llm_first = prefill_s + (first_hop + lookahead - 1) * per_token
    latency = llm_first + flow1 + hift1
    print(
        f"\nfirst-chunk latency: {1000 * latency:.0f} ms = prefill {1000 * prefill_s:.0f} + "
        f"{first_hop + lookahead - 1} decode steps {1000 * (llm_first - prefill_s):.0f} + "
        f"flow {1000 * flow1:.0f} + HiFT {1000 * hift1:.0f} (first chunk: {samples1 / 24000:.2f} s of audio)"
    )
    time_flow_cache(model, timer, args.cache_prompt_seconds, warmup, args.cache_repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
