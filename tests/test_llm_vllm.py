"""The vLLM token generator's bookkeeping, driven by a stand-in engine (vLLM itself is not installed)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cosyvoice.llm import END_OF_PROMPT_TEXT_ID, CosyVoice3LM, LLMPrompt, LLMRequest
from cosyvoice.model import CosyVoice3
from cosyvoice.pretrained import load_llm
from cosyvoice.tools.export_hf import ExportError
from scripts.make_tiny_model import make_model_dir
from tts_engine.backends.cosyvoice import CosyVoiceBackend
from tts_engine.backends.cosyvoice.llm_vllm import (
    VLLMRunner,
    VLLMUnavailableError,
    default_export_dir,
    ensure_export,
)

EOS = 6562


class FakeEngine:
    """Plays a scripted token list per request, one token per ``step()`` for every running request."""

    def __init__(self, scripts: list[list[int]]) -> None:
        self.scripts = list(scripts)  # handed out to requests in arrival order
        self.running: dict[str, list[int]] = {}
        self.added: list[tuple[str, dict, SimpleNamespace]] = []
        self.aborted: list[str] = []
        self.steps = 0

    def add_request(self, request_id: str, prompt: dict, params: SimpleNamespace) -> None:
        self.added.append((request_id, prompt, params))
        self.running[request_id] = list(self.scripts.pop(0))[: params.max_tokens]

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> list[SimpleNamespace]:
        self.steps += 1
        outputs = []
        for request_id, tokens in list(self.running.items()):
            token = tokens.pop(0)
            finished = not tokens or token >= 6561
            if finished:
                del self.running[request_id]
            outputs.append(
                SimpleNamespace(
                    request_id=request_id, finished=finished, outputs=[SimpleNamespace(token_ids=[token])]
                )
            )
        return outputs

    def abort_request(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.aborted.append(request_id)
            self.running.pop(request_id, None)


FAKE_API = (SimpleNamespace(SamplingParams=SimpleNamespace), SimpleNamespace(DELTA="delta"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("cosy") / "model", preset="tiny", seed=5, onnx_models=False)


@pytest.fixture(scope="module")
def lm(model_dir: Path) -> CosyVoice3LM:
    return load_llm(model_dir)


def make_runner(lm: CosyVoice3LM, model_dir: Path, scripts: list[list[int]], **kw) -> VLLMRunner:
    return VLLMRunner(
        lm,
        ensure_export(model_dir),
        max_batch=2,
        max_len=512,
        engine=FakeEngine(scripts),
        vllm_api=FAKE_API,
        **kw,
    )


def request(seed: int, n_text: int = 3) -> LLMRequest:
    text = [END_OF_PROMPT_TEXT_ID] + list(range(10, 10 + n_text - 1))
    return LLMRequest(LLMPrompt.create(text, [7, 8], [1, 2, 3]), seed=seed)


def test_prefill_sends_prompt_embeds_and_request_limits(lm: CosyVoice3LM, model_dir: Path) -> None:
    runner = make_runner(lm, model_dir, [[40, 41]], dtype="float32")
    req = request(seed=1)
    out = runner.prefill([req])
    assert out[0].token == 40 and not out[0].finished and req.slot is not None
    (_, prompt, params) = runner.engine.added[0]
    assert torch.equal(prompt["prompt_embeds"], lm.embed_prompt(req.prompt))
    assert (params.min_tokens, params.max_tokens) == (req.min_len, req.max_len) == (6, 60)
    assert params.stop_token_ids == list(range(6561, 6761))
    assert (params.top_k, params.top_p, params.temperature) == (25, 0.8, 1.0)
    again = make_runner(lm, model_dir, [[40]])
    again.prefill([request(seed=1)])
    assert again.engine.added[0][2].seed == params.seed  # the seed comes from the request's generator
    assert again.engine.added[0][1]["prompt_embeds"].dtype == torch.bfloat16  # default engine dtype


def test_tokens_of_requests_not_asked_for_wait_in_order(lm: CosyVoice3LM, model_dir: Path) -> None:
    runner = make_runner(lm, model_dir, [[10, 11, 12, 13, EOS], [20, 21, 22, 23, 24, 25]])
    a, b = request(seed=1), request(seed=2)
    assert [o.token for o in runner.prefill([a, b])] == [10, 20]
    for expected in (21, 22, 23):  # only b is stepped; the engine advances a too
        assert runner.decode_step([b])[0].token == expected
    assert [runner.decode_step([a])[0].token for _ in range(3)] == [11, 12, 13]
    assert runner.engine.steps == 4  # a's tokens were already queued
    end = runner.decode_step([a])[0]
    assert (end.token, end.finished, a.stop_token, a.slot) == (None, True, EOS, None)
    assert a.out_tokens == [10, 11, 12, 13] and runner.num_free_slots == 1
    assert runner.engine.aborted == []


def test_max_len_and_silent_filter(lm: CosyVoice3LM, model_dir: Path) -> None:
    runner = make_runner(lm, model_dir, [[1] * 100])
    req = request(seed=3, n_text=1)  # max_len 20
    outs = runner.prefill([req])
    while not outs[-1].finished:
        outs += runner.decode_step([req])
    assert len(req.out_tokens) == 20 and req.stop_token is None
    assert len(req.flow_tokens) == 5  # a silent run is cut after 5 for the flow
    assert [o.to_flow for o in outs[:6]] == [True] * 5 + [False]
    assert runner.num_free_slots == 2


def test_abort_drops_the_engine_request(lm: CosyVoice3LM, model_dir: Path) -> None:
    runner = make_runner(lm, model_dir, [[5, 6, 7]])
    req = request(seed=4)
    runner.prefill([req])
    runner.abort(req)
    assert req.finished and req.slot is None and runner.engine.aborted == ["cosyvoice-0"]
    runner.abort(req)  # idempotent
    assert runner.engine.aborted == ["cosyvoice-0"]


def test_missing_vllm_gives_install_hint(lm: CosyVoice3LM, model_dir: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(VLLMUnavailableError, match=r"pip install \.\[vllm\]"):
        VLLMRunner(lm, ensure_export(model_dir), max_batch=1, max_len=64)


def test_backend_switch(model_dir: Path, monkeypatch) -> None:
    model = CosyVoice3.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="llm_backend"):
        CosyVoiceBackend(model=model, llm_backend="trt")
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(VLLMUnavailableError, match="vllm"):
        CosyVoiceBackend(model=model, llm_backend="vllm")
    assert CosyVoiceBackend(model=model, llm_backend="native").runner.num_free_slots > 0


def test_ensure_export_refuses_a_foreign_directory(model_dir: Path, tmp_path: Path) -> None:
    assert default_export_dir(model_dir).name == "vllm"
    (tmp_path / "other").mkdir()
    with pytest.raises(ExportError):
        ensure_export(model_dir, export_dir=tmp_path / "other")
