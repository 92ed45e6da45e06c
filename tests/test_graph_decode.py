"""GraphDecodeRunner on the CPU: same tokens and log-probs as LLMRunner under continuous batching,
abort and slot reuse, the scratch slot, the compiled step, the graph bookkeeping and bad settings."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from cosyvoice.llm import (
    CosyVoice3LM,
    LengthRule,
    LLMInputError,
    LLMRequest,
    LLMRunner,
    generate,
    graph_decode,
)
from cosyvoice.llm.graph_decode import GraphDecodeConfigError, GraphDecodeRunner, power_of_two_buckets
from cosyvoice.llm.qwen2 import KVCacheError
from tests.test_cosy_llm import TINY, prompt

# every request emits exactly ratio x text tokens: no early stop, so batch and kv sizes are known
EXACT = LengthRule(min_token_text_ratio=3, max_token_text_ratio=3, mask_all_stops_before_min=True)
# (text, prompt text, prompt speech, seed): prefixes of 7, 8, 12, 17 and 28 positions, so with one
# admission per step the longest row needs kv buckets 16, then 32, then 64
SPECS = [(2, 3, 0, 12), (3, 2, 1, 14), (2, 4, 4, 15), (4, 6, 5, 11), (5, 9, 12, 13)]


class RecordingRequest(LLMRequest):
    """Keeps every log-prob row it was sampled from."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.logps: list[torch.Tensor] = []

    def _sampling_logp(self, logp: torch.Tensor, stop_from: int) -> torch.Tensor:
        self.logps.append(logp.clone())
        return super()._sampling_logp(logp, stop_from)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The model is tiny: one intra-op thread is fastest and does not fight other jobs for cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def lm() -> CosyVoice3LM:
    torch.manual_seed(1)
    return CosyVoice3LM(TINY).eval()


def new_request(spec: tuple[int, int, int, int], lengths: LengthRule = EXACT) -> RecordingRequest:
    return RecordingRequest(prompt(*spec[:3], seed=spec[3]), seed=spec[3], lengths=lengths)


def drive(
    runner: LLMRunner,
    specs: list[tuple[int, int, int, int]],
    *,
    abort_after: dict[int, int] | None = None,
    between_steps: Callable[[int], None] | None = None,
) -> tuple[list[RecordingRequest], list[int]]:
    """Continuous batching: admit one waiting request per step (while slots are free), decode
    the running ones; ``abort_after[i] = n`` aborts request i once it has n tokens. Returns the
    requests and the batch size of every decode step."""
    abort_after = abort_after or {}
    waiting = [new_request(s) for s in specs]
    requests, running, batch_sizes, step = list(waiting), [], [], 0
    while waiting or running:
        for index, request in enumerate(requests):
            if (
                index in abort_after
                and len(request.out_tokens) >= abort_after[index]
                and not request.finished
            ):
                runner.abort(request)
        running = [r for r in running if not r.finished]
        if running:
            batch_sizes.append(len(running))
        admit = waiting[: min(1, runner.num_free_slots)]
        waiting = waiting[len(admit) :]
        runner.decode_step(running)
        runner.prefill(admit)
        running = [r for r in running + admit if not r.finished]
        if between_steps is not None:
            between_steps(step)
        step += 1
    return requests, batch_sizes


def assert_same_generation(got: list[RecordingRequest], want: list[RecordingRequest]) -> None:
    assert [r.out_tokens for r in got] == [r.out_tokens for r in want]
    for g, w in zip(got, want, strict=True):
        assert len(g.logps) == len(w.logps)
        torch.testing.assert_close(torch.stack(g.logps), torch.stack(w.logps), atol=1e-5, rtol=0)


def test_power_of_two_buckets() -> None:
    assert power_of_two_buckets(1, 6) == (1, 2, 4, 6)
    assert power_of_two_buckets(1, 8) == (1, 2, 4, 8)
    assert power_of_two_buckets(1, 1) == (1,)
    assert power_of_two_buckets(256, 100) == (100,)
    assert power_of_two_buckets(256, 1500) == (256, 512, 1024, 1500)
    with pytest.raises(GraphDecodeConfigError):
        power_of_two_buckets(3, 10)


def test_matches_llm_runner_under_continuous_batching(lm: CosyVoice3LM) -> None:
    reference, ref_sizes = drive(LLMRunner(lm, max_batch=4, max_len=64), SPECS)
    runner = GraphDecodeRunner(lm, max_batch=4, max_len=64, kv_buckets=(16, 32, 64))
    got, sizes = drive(runner, SPECS)
    assert_same_generation(got, reference)
    assert sizes == ref_sizes and 3 in sizes  # a batch of 3 ran padded to 4
    used = runner.prepared_shapes
    assert {b for b, _ in used} == {1, 2, 4} and {k for _, k in used} == {16, 32, 64}
    assert runner.num_free_slots == 4 and runner.num_graphs == 0


def test_request_filling_the_cache_exactly_matches_solo_generation(lm: CosyVoice3LM) -> None:
    solo = new_request(SPECS[2])
    want = list(generate(lm, solo))
    request = new_request(SPECS[2])
    runner = GraphDecodeRunner(lm, max_batch=1, max_len=request.num_cache_positions)
    out = runner.prefill([request])[0]
    while not out.finished:
        out = runner.decode_step([request])[0]
    assert request.out_tokens == want and len(want) == request.max_len
    assert runner.kv_buckets == (request.num_cache_positions,)


def test_abort_frees_the_slot_and_neighbours_are_unaffected(lm: CosyVoice3LM) -> None:
    runner = GraphDecodeRunner(lm, max_batch=3, max_len=64, kv_buckets=(16, 64))
    warmed: list[int] = []

    def warm_mid_stream(step: int) -> None:  # warm-up only writes the scratch slot
        if step == 3:
            runner.warmup()
            warmed.append(len(runner.prepared_shapes))

    got, _ = drive(runner, SPECS, abort_after={0: 3}, between_steps=warm_mid_stream)
    assert warmed == [len(runner.batch_buckets) * len(runner.kv_buckets)]
    assert got[0].finished and len(got[0].out_tokens) == 3 and got[0].slot is None
    reference, _ = drive(LLMRunner(lm, max_batch=3, max_len=64), SPECS, abort_after={0: 3})
    assert_same_generation(got, reference)
    for spec, request in zip(SPECS[1:], got[1:], strict=True):  # every neighbour equals its solo run
        assert request.out_tokens == list(generate(lm, new_request(spec)))
    assert runner.num_free_slots == 3


def test_scratch_slot_is_never_handed_out_nor_read(lm: CosyVoice3LM) -> None:
    runner = GraphDecodeRunner(lm, max_batch=4, max_len=64, kv_buckets=(16, 64))
    scratch = 4
    assert runner.cache.keys[0].shape[0] == 5
    for keys, values in zip(runner.cache.keys, runner.cache.values, strict=True):
        keys[scratch] = float("nan")
        values[scratch] = 1e30
    requests = [new_request(s) for s in SPECS[:3]]
    runner.prefill(requests)
    for _ in range(4):  # three rows padded to a batch of 4, the padding row on a poisoned slot
        runner.decode_step(requests)
    for spec, request in zip(SPECS, requests, strict=False):
        want = new_request(spec)
        list(generate(lm, want))
        assert request.out_tokens == want.out_tokens[:5]
        torch.testing.assert_close(torch.stack(request.logps), torch.stack(want.logps[:5]), atol=1e-5, rtol=0)
    runner.prefill([new_request(SPECS[3])])
    assert runner.num_free_slots == 0
    with pytest.raises(LLMInputError):
        runner.prefill([new_request(SPECS[4])])
    with pytest.raises(KVCacheError):
        runner.cache.allocate()
    runner.abort(requests[1])
    assert runner.num_free_slots == 1 and runner.cache.allocate() == 1


def test_compiled_step_traces_as_one_graph_and_matches_eager(lm: CosyVoice3LM) -> None:
    specs = SPECS[:3]
    reference, _ = drive(LLMRunner(lm, max_batch=2, max_len=64), specs)
    # fullgraph=True: any graph break raises instead of silently splitting the step
    runner = GraphDecodeRunner(
        lm, max_batch=2, max_len=64, kv_buckets=(64,), compile_step=True, compile_backend="aot_eager"
    )
    got, _ = drive(runner, specs)
    assert_same_generation(got, reference)
    assert runner.prepared_shapes == {(1, 64), (2, 64)}


class FakeCapturer:
    """CPU stand-in for the CUDA graph capturer: runs the warm-ups, then 'replays' by calling
    the step again, which reads the same static buffers a real graph would."""

    captures: list[Callable[[], None]] = []

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        for _ in range(graph_decode.GRAPH_WARMUP_ITERS):
            step()
        FakeCapturer.captures.append(step)
        return step


def test_graph_path_captures_each_shape_once_and_matches(lm: CosyVoice3LM, monkeypatch) -> None:
    monkeypatch.setattr(graph_decode, "_CudaGraphCapturer", FakeCapturer)
    FakeCapturer.captures = []
    reference, _ = drive(LLMRunner(lm, max_batch=4, max_len=64), SPECS)
    runner = GraphDecodeRunner(lm, max_batch=4, max_len=64, kv_buckets=(16, 32, 64), use_cuda_graphs=True)
    got, _ = drive(runner, SPECS)  # captures happen mid-stream, on first use of each shape
    assert_same_generation(got, reference)
    assert runner.num_graphs == len(runner.prepared_shapes) == len(FakeCapturer.captures) >= 5
    runner.warmup()
    assert runner.num_graphs == 9 and len(FakeCapturer.captures) == 9  # nothing captured twice


def test_warmup_covers_the_requested_buckets(lm: CosyVoice3LM) -> None:
    runner = GraphDecodeRunner(lm, max_batch=6, max_len=100, kv_buckets=(16, 32, 100))
    assert runner.batch_buckets == (1, 2, 4, 6)
    runner.warmup(batch_sizes=[3, 4], kv_lengths=[20])
    assert runner.prepared_shapes == {(4, 32)}
    runner.warmup()
    assert runner.prepared_shapes == {(b, k) for b in (1, 2, 4, 6) for k in (16, 32, 100)}
    with pytest.raises(GraphDecodeConfigError):
        runner.warmup(batch_sizes=[7])
    with pytest.raises(GraphDecodeConfigError):
        runner.warmup(kv_lengths=[0])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_buckets": (1, 2)},  # does not reach max_batch
        {"batch_buckets": (2, 1, 4)},
        {"batch_buckets": (1, 4, 8)},  # beyond max_batch
        {"batch_buckets": "pow2"},
        {"batch_buckets": (1.5, 4)},
        {"kv_buckets": (16, 128)},  # beyond max_len
        {"kv_buckets": ()},
        {"use_cuda_graphs": True},  # the model is on the CPU
        {"use_cuda_graphs": True, "compile_step": True, "compile_mode": "reduce-overhead"},
        {"compile_mode": "max-autotune"},  # without compile_step
        {"compile_step": True, "compile_mode": "no-such-mode"},
        {"compile_step": True, "compile_backend": "no-such-backend"},
        {"compile_step": True, "compile_mode": "default", "compile_backend": "aot_eager"},
        {"max_batch": 0},
    ],
)
def test_bad_settings_raise(lm: CosyVoice3LM, kwargs: dict) -> None:
    settings = {"max_batch": 4, "max_len": 64} | kwargs
    with pytest.raises(GraphDecodeConfigError):
        GraphDecodeRunner(lm, **settings)


def test_bad_requests_raise(lm: CosyVoice3LM) -> None:
    runner = GraphDecodeRunner(lm, max_batch=2, max_len=64)
    with pytest.raises(LLMInputError):
        runner.decode_step([new_request(SPECS[0])])  # never prefilled
    request = new_request(SPECS[1])
    runner.prefill([request])
    with pytest.raises(KVCacheError):
        runner.decode_step([request, request])
    assert runner.decode_step([]) == []
