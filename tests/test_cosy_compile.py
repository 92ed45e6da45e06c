"""Behaviour of cosyvoice.token2wav.compile (torch.compile of Token2Wav) on a tiny flow and vocoder, CPU only.

The compiled runs use the ``aot_eager`` backend (dynamo + AOT autograd tracing, eager kernels): no C++
compiler needed, and any difference from eager comes from the traced graph and the shape padding.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cosyvoice.flow import DiTConfig, Flow, FlowConfig, FlowInputError, attention_mask
from cosyvoice.hift import CausalHift
from cosyvoice.token2wav import HopSchedule, SpeakerPrompt, Token2Wav
from cosyvoice.token2wav.compile import CompileError, compile_token2wav
from tests.test_cosy_hift import tiny_config, tiny_hift

VOCAB = 50
CHUNK = 8  # attention chunk of the tiny flow in frames (4 tokens)


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_flow() -> Flow:
    dit = DiTConfig(
        dim=32,
        depth=1,
        heads=2,
        dim_head=16,
        ff_dim=32,
        conv_kernel=5,
        conv_groups=4,
        static_chunk_size=CHUNK,
    )
    torch.manual_seed(3)
    flow = Flow(FlowConfig(dit=dit, vocab_size=VOCAB, spk_embed_dim=12, pre_lookahead_channels=16)).eval()
    with torch.no_grad():  # non-zero AdaLN so the block really contributes
        for p in flow.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return flow


def small_hift() -> CausalHift:
    """Release rates and kernels with one resblock per stage (a quarter of the ops: faster tracing)."""
    config = dataclasses.replace(
        tiny_config(),
        resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1, 3),),
        source_resblock_dilation_sizes=((1,),) * 3,
    )
    return tiny_hift(config=config, noise_seconds=10)


@pytest.fixture(scope="module")
def model() -> Token2Wav:
    schedule = HopSchedule(first_hop=CHUNK // 2, max_hop=16, scale=2, lookahead=3)
    return Token2Wav(small_flow(), small_hift(), schedule=schedule)


def prompt(num_tokens: int, seed: int) -> SpeakerPrompt:
    g = torch.Generator().manual_seed(seed)
    return SpeakerPrompt(
        prompt_token=torch.randint(0, VOCAB, (num_tokens,), generator=g),
        prompt_feat=torch.randn(2 * num_tokens, 80, generator=g),
        embedding=torch.randn(12, generator=g),
    )


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def batched_streaming_run(model: Token2Wav) -> tuple[list[list[torch.Tensor]], list[int], list]:
    """Three requests (different prompts and lengths) run hop by hop as one batch per round."""
    specs = [(prompt(5, 1), tokens(60, 1)), (prompt(9, 2), tokens(45, 2)), (prompt(0, 3), tokens(52, 3))]
    streams = [model.stream(p) for p, _ in specs]
    for stream, (_, values) in zip(streams, specs, strict=True):
        stream.add_tokens(values)
        stream.end_input()
    chunks: list[list[torch.Tensor]] = [[] for _ in streams]
    batches = []
    while jobs := [job for s in streams if (job := s.next_job()) is not None]:
        batches.append(len(jobs))
        for job, chunk in zip(jobs, model.run(jobs), strict=True):
            chunks[streams.index(job.stream)].append(chunk)
    return chunks, batches, [s.hop_log for s in streams]


def assert_same_audio(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    assert [[c.shape for c in row] for row in got] == [[c.shape for c in row] for row in want]
    for row_got, row_want in zip(got, want, strict=True):
        for a, b in zip(row_got, row_want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_compiled_streaming_run_equals_eager_with_few_graphs(model: Token2Wav) -> None:
    eager, batches, hop_log = batched_streaming_run(model)
    assert len(batches) >= 5 and max(batches) == 3 and len(set(batches)) > 1  # several hops, mixed batches
    compiled = compile_token2wav(
        model,
        backend="aot_eager",
        fullgraph=True,
        flow_frame_multiple=CHUNK,
        hift_frame_multiple=CHUNK,
    )
    try:
        got, _, compiled_log = batched_streaming_run(model)
        assert compiled_log == hop_log
        assert_same_audio(got, eager)
        graphs = compiled.graphs
        # Batch and time are symbolic: at most one graph per attention-mask form (chunk / none) for the
        # flow, and per batch class for the vocoder, never one per call (there were >= 5 calls, all shapes
        # different).
        assert 1 <= graphs["flow"] <= 2 and 1 <= graphs["hift"] <= 2
        again, _, _ = batched_streaming_run(model)  # same shapes again: no new graph
        assert compiled.graphs == graphs
        assert_same_audio(again, eager)
    finally:
        compiled.restore()
    assert not compiled.active and model.flow.decoder.frame_multiple == 1
    after, _, _ = batched_streaming_run(model)
    assert compiled.graphs == graphs  # restored: eager code, nothing compiled or called any more
    assert_same_audio(after, eager)


# aten ops that hand a tensor value (or a data-dependent shape) to the host: a device sync on a GPU.
HOST_READS = {
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::nonzero",
    "aten::equal",
    "aten::allclose",
    "aten::masked_select",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
}


class HostReads(TorchDispatchMode):
    """Records every host-reading aten op run while active."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.name() in HOST_READS:
            self.seen.append(func.name())
        return func(*args, **(kwargs or {}))


def test_flow_solve_and_vocoder_read_nothing_back_to_the_host(
    model: Token2Wav, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = HostReads()
    calls = []

    def watched(fn):
        def run(*args, **kwargs):
            calls.append(fn.__name__)
            with reads:
                return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(model.flow.decoder, "begin", watched(model.flow.decoder.begin))  # the solve: its set-up
    monkeypatch.setattr(model.flow.decoder, "advance", watched(model.flow.decoder.advance))  # ... its Euler steps
    monkeypatch.setattr(model.hift, "forward", watched(model.hift.forward))
    streams = [model.stream(prompt(5, 1)), model.stream(prompt(9, 2))]
    for stream, n in zip(streams, (40, 30), strict=True):
        stream.add_tokens(tokens(n, n))
        stream.end_input()
    for _ in range(3):  # first hop, a windowed hop (phase resume, noise offsets), then one more
        model.run([s.next_job() for s in streams])
    assert calls.count("begin") == calls.count("advance") == calls.count("forward") == 3
    assert reads.seen == []


def test_target_runs_eager_once_its_recompile_limit_is_hit(
    model: Token2Wav, caplog: pytest.LogCaptureFixture
) -> None:
    eager, _, _ = batched_streaming_run(model)
    # static shapes and room for one graph: the second flow shape cannot compile
    compiled = compile_token2wav(
        model, backend="aot_eager", dynamic=False, targets=("flow",), recompile_limit=1
    )
    try:
        with caplog.at_level("WARNING", logger="cosyvoice.token2wav.compile"):
            got, _, _ = batched_streaming_run(model)
    finally:
        compiled.restore()
    assert compiled.graphs == {"flow": 1} and compiled.fell_back == ("flow",)
    assert "recompile limit" in caplog.text
    assert_same_audio(got, eager)


def test_padded_flow_solve_equals_unpadded(model: Token2Wav) -> None:
    flow = model.flow
    g = torch.Generator().manual_seed(5)
    token = torch.randint(0, VOCAB, (3, 21), generator=g)
    prompt_token = torch.randint(0, VOCAB, (3, 6), generator=g)
    prompt_feat = torch.randn(3, 12, 80, generator=g)
    args = (
        token,
        [21, 13, 17],
        prompt_token,
        [6, 0, 3],
        prompt_feat,
        [12, 0, 6],
        torch.randn(3, 12, generator=g),
    )
    kwargs = {"streaming": [True, False, True], "finalize": [False, True, False], "n_timesteps": 4}
    plain = flow.inference(*args, **kwargs)
    flow.decoder.frame_multiple = 16  # 54 frames -> 64
    try:
        assert flow.decoder.padded_frames(54) == 64
        padded = flow.inference(*args, **kwargs)
    finally:
        flow.decoder.frame_multiple = 1
    assert padded.shape == plain.shape
    torch.testing.assert_close(padded, plain, atol=1e-5, rtol=0)


def test_flow_checks_token_ids_of_each_row_only(model: Token2Wav) -> None:
    flow = model.flow
    token = torch.randint(0, VOCAB, (2, 8))
    prompt_token = torch.randint(0, VOCAB, (2, 2))
    rest = ([2, 2], torch.randn(2, 4, 80), [4, 4], torch.randn(2, 12))
    token[1, 6:] = VOCAB + 7  # padding past row 1's 6 tokens: never read
    out = flow.inference(token, [8, 6], prompt_token, *rest, n_timesteps=1)
    assert out.shape == (2, 80, 16)
    prompt_token[0, 1] = VOCAB  # inside row 0's prompt
    with pytest.raises(FlowInputError, match="vocab"):
        flow.inference(token, [8, 6], prompt_token, *rest, n_timesteps=1)


def test_bad_arguments_raise_compile_error(model: Token2Wav) -> None:
    bad = [
        {"targets": ("flow", "llm")},
        {"targets": ()},
        {"targets": ("flow", "flow")},
        {"backend": "no-such-backend"},
        {"backend": "aot_eager", "mode": "max-autotune"},
        {"mode": "fastest"},
        {"flow_frame_multiple": 0},
        {"hift_frame_multiple": 2.5},
        {"flow_frame_multiple": True},
        {"recompile_limit": -1},
        {"dynamic": None},
        {"fullgraph": "yes"},
    ]
    for kwargs in bad:
        with pytest.raises(CompileError):
            compile_token2wav(model, **{"backend": "aot_eager", **kwargs})
    with pytest.raises(CompileError, match="Token2Wav"):
        compile_token2wav(model.flow, backend="aot_eager")  # type: ignore[arg-type]
    assert "forward" not in vars(model.flow.decoder.estimator)  # nothing was half-applied
    handle = compile_token2wav(model, backend="aot_eager", targets=("flow",))  # compiles lazily: cheap
    try:
        with pytest.raises(CompileError, match="already compiled"):
            compile_token2wav(model, backend="aot_eager", targets=("hift",))
    finally:
        handle.restore()
    assert handle.graphs == {"flow": 0}


def test_padding_settings_are_checked_where_they_are_used(model: Token2Wav) -> None:
    decoder = model.flow.decoder
    decoder.frame_multiple = 0
    try:
        with pytest.raises(FlowInputError, match="frame_multiple"):
            decoder.padded_frames(10)
    finally:
        decoder.frame_multiple = 1
    assert decoder.padded_frames(10) == 10
    decoder.frame_multiple = 64
    try:
        assert (
            decoder.padded_frames(10) == 64
            and decoder.padded_frames(decoder.max_frames - 1) == decoder.max_frames
        )
    finally:
        decoder.frame_multiple = 1
    with pytest.raises(ValueError, match="seq_len"):
        attention_mask([5, 7], [True, True], chunk_size=CHUNK, seq_len=6)
    mask = attention_mask([5, 7], [False, False], chunk_size=CHUNK, seq_len=9)
    assert mask is not None and mask.shape == (2, 1, 9, 9)
    assert not mask[1, 0, 0, 7:].any() and mask[1, 0, 0, :7].all()  # padded keys are never attended
