"""CosyVoice3's LM stack on tiny random models built here (no fixture files): Qwen2 + KV cache, speech LM."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from cosyvoice.checkpoint import CheckpointError
from cosyvoice.llm import (
    END_OF_PROMPT_TEXT_ID,
    EOS_ID,
    SOS_ID,
    CosyVoice3LM,
    LengthRule,
    LLMInputError,
    LLMPrompt,
    LLMRequest,
    LLMRunner,
    generate,
)
from cosyvoice.llm.qwen2 import KVCacheError, Qwen2Config, Qwen2Model

TINY = Qwen2Config(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=151936,
)


def tiny_decoder(seed: int = 0) -> Qwen2Model:
    torch.manual_seed(seed)
    config = dataclasses.replace(TINY, vocab_size=32)
    model = Qwen2Model(config).eval()
    with torch.no_grad():  # non-trivial norm weights and biases
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def lm() -> CosyVoice3LM:
    torch.manual_seed(1)
    return CosyVoice3LM(TINY).eval()


def prompt(text_len: int, prompt_len: int, speech_len: int, seed: int) -> LLMPrompt:
    g = torch.Generator().manual_seed(seed)
    prompt_text = torch.randint(0, 151000, (prompt_len,), generator=g)
    prompt_text[-1] = END_OF_PROMPT_TEXT_ID
    return LLMPrompt.create(
        torch.randint(0, 151000, (text_len,), generator=g),
        prompt_text,
        torch.randint(0, 6561, (speech_len,), generator=g),
    )


# ---------------------------------------------------------------- Qwen2 decoder + KV cache


@torch.no_grad()
def run_solo(model: Qwen2Model, prefix: torch.Tensor, steps: list[torch.Tensor]) -> list[torch.Tensor]:
    cache = model.new_cache(max_batch=1, max_len=64)
    slot = cache.allocate()
    outs = [model(prefix[None], cache, [slot])[0]]  # [L, H]
    for step in steps:
        outs.append(model(step[None, None], cache, [slot])[0, 0])  # [H]
    return outs


@torch.no_grad()
def test_batched_prefill_and_decode_match_solo_rows() -> None:
    model = tiny_decoder()
    torch.manual_seed(5)
    lengths = [5, 9, 2]
    prefixes = [torch.randn(n, 16) for n in lengths]
    steps = [[torch.randn(16) for _ in range(4)] for _ in lengths]
    cache = model.new_cache(max_batch=4, max_len=64)
    slots = [cache.allocate() for _ in lengths]
    batch = torch.nn.utils.rnn.pad_sequence(prefixes, batch_first=True)  # [3, 9, 16]
    prefill = model(batch, cache, slots, lengths)
    decoded = [model(torch.stack([s[i] for s in steps])[:, None], cache, slots)[:, 0] for i in range(4)]
    for row, n in enumerate(lengths):
        solo = run_solo(model, prefixes[row], steps[row])
        torch.testing.assert_close(prefill[row, :n], solo[0], atol=1e-5, rtol=0)
        for i in range(4):
            torch.testing.assert_close(decoded[i][row], solo[1 + i], atol=1e-5, rtol=0)
    assert [cache.length(s) for s in slots] == [n + 4 for n in lengths]


@torch.no_grad()
def test_incremental_decode_equals_one_causal_pass() -> None:
    model = tiny_decoder()
    seq = torch.randn(12, 16)
    full = run_solo(model, seq, [])[0]  # [12, H]
    stepwise = run_solo(model, seq[:3], list(seq[3:]))
    torch.testing.assert_close(torch.cat([stepwise[0], torch.stack(stepwise[1:])]), full, atol=1e-5, rtol=0)


@torch.no_grad()
def test_outputs_are_causal_and_position_dependent() -> None:
    model = tiny_decoder()
    seq = torch.randn(6, 16)
    changed = seq.clone()
    changed[4:] = torch.randn(2, 16)
    a, b = run_solo(model, seq, [])[0], run_solo(model, changed, [])[0]
    torch.testing.assert_close(a[:4], b[:4], atol=1e-6, rtol=0)
    # the last position sees the same set of vectors in both orders; only RoPE tells them apart
    x, y = torch.randn(2, 16)
    last_xyx = run_solo(model, torch.stack([x, y, x]), [])[0][-1]
    last_yxx = run_solo(model, torch.stack([y, x, x]), [])[0][-1]
    assert not torch.allclose(last_xyx, last_yxx, atol=1e-3)


@torch.no_grad()
def test_freed_slot_is_reused_without_disturbing_other_rows() -> None:
    model = tiny_decoder()
    a, b, c = torch.randn(7, 16), torch.randn(4, 16), torch.randn(3, 16)
    b_steps = [torch.randn(16) for _ in range(2)]
    cache = model.new_cache(max_batch=2, max_len=16)
    slot_a, slot_b = cache.allocate(), cache.allocate()
    model(torch.nn.utils.rnn.pad_sequence([a, b], batch_first=True), cache, [slot_a, slot_b], [7, 4])
    with pytest.raises(KVCacheError):
        cache.allocate()
    cache.free(slot_a)
    slot_c = cache.allocate()
    assert slot_c == slot_a and cache.length(slot_c) == 0
    out_c = model(c[None], cache, [slot_c])[0]
    out_b = model(b_steps[0][None, None], cache, [slot_b])[0, 0]
    # mixed batch: c decodes while b takes its second step
    step_c = torch.randn(16)
    mixed = model(torch.stack([step_c, b_steps[1]])[:, None], cache, [slot_c, slot_b])[:, 0]
    solo_b = run_solo(model, b, b_steps)
    solo_c = run_solo(model, c, [step_c])
    torch.testing.assert_close(out_c, solo_c[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(out_b, solo_b[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[0], solo_c[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[1], solo_b[2], atol=1e-5, rtol=0)


@torch.no_grad()
def test_cache_misuse_raises() -> None:
    model = tiny_decoder()
    cache = model.new_cache(max_batch=1, max_len=4)
    slot = cache.allocate()
    with pytest.raises(KVCacheError):
        model(torch.randn(1, 5, 16), cache, [slot])
    model(torch.randn(1, 4, 16), cache, [slot])
    with pytest.raises(KVCacheError):
        model(torch.randn(1, 1, 16), cache, [slot])
    cache.free(slot)
    with pytest.raises(KVCacheError):
        model(torch.randn(1, 1, 16), cache, [slot])


def test_config_from_hf_json_and_validation(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 24, "intermediate_size": 64, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
                                "rope_theta": 10000.0, "model_type": "qwen2"}))  # fmt: skip
    config = Qwen2Config.from_json(path)
    assert (config.head_dim, config.rope_theta, config.rms_norm_eps) == (6, 10000.0, 1e-6)
    with pytest.raises(ValueError):
        Qwen2Config.from_dict({"hidden_size": 24})
    with pytest.raises(ValueError):
        dataclasses.replace(TINY, num_key_value_heads=3)


# ---------------------------------------------------------------- speech LM


def rigged_lm(logits: dict[int, float]) -> CosyVoice3LM:
    """A model whose log-probs are the same at every step: all inputs embed to ones, layers
    add nothing, and llm_decoder row i sums to ``logits.get(i, 0)``."""
    model = CosyVoice3LM(dataclasses.replace(TINY, num_hidden_layers=1)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight.fill_(1.0)
        model.speech_embedding.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        for token, value in logits.items():
            model.llm_decoder.weight[token] = value / TINY.hidden_size
    return model


def sample_all(model: CosyVoice3LM, request: LLMRequest) -> list[int]:
    return list(generate(model, request))


def test_min_and_max_length_follow_text_length() -> None:
    model = rigged_lm({i: -1e4 for i in range(SOS_ID, SOS_ID + 200)})  # stops impossible
    p = prompt(text_len=3, prompt_len=4, speech_len=2, seed=0)
    request = LLMRequest(p, seed=0, lengths=LengthRule(min_token_text_ratio=2, max_token_text_ratio=4.5))
    assert (request.min_len, request.max_len) == (6, 13)
    tokens = sample_all(model, request)
    assert len(tokens) == 13 and all(0 <= t < SOS_ID for t in tokens) and request.stop_token is None


def test_eos_before_min_len_stops_unless_quirk_disabled() -> None:
    model = rigged_lm({EOS_ID: 30.0})
    p = prompt(text_len=3, prompt_len=4, speech_len=0, seed=1)
    quirk = LLMRequest(p, seed=0)
    assert sample_all(model, quirk) == [] and quirk.stop_token == EOS_ID
    strict = LLMRequest(p, seed=0, lengths=LengthRule(mask_all_stops_before_min=True))
    assert len(sample_all(model, strict)) == strict.min_len == 6 and strict.stop_token == EOS_ID


def test_sos_is_masked_until_min_len() -> None:
    model = rigged_lm({SOS_ID: 30.0})
    request = LLMRequest(prompt(text_len=4, prompt_len=2, speech_len=3, seed=2), seed=0)
    assert len(sample_all(model, request)) == request.min_len == 8 and request.stop_token == SOS_ID


@torch.no_grad()
def test_forward_logp_matches_one_pass_over_prefix_and_targets(lm: CosyVoice3LM) -> None:
    p = prompt(text_len=5, prompt_len=6, speech_len=4, seed=3)
    targets = torch.randint(0, 6561, (7,))
    logp = lm.forward_logp(p, targets)
    assert logp.shape == (8, 6761)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(8), atol=1e-5, rtol=0)
    seq = torch.cat([lm.embed_prompt(p), lm.speech_embedding(targets)])  # [L + 7, H]
    cache = lm.new_cache(max_batch=1, max_len=seq.shape[0])
    hidden = lm.model(seq[None], cache, [cache.allocate()])[0]  # [L + 7, H]
    full = lm.speech_logp(hidden[-8:])
    torch.testing.assert_close(logp, full, atol=1e-5, rtol=0)


def test_batched_generation_equals_solo_generation(lm: CosyVoice3LM) -> None:
    lengths = LengthRule(min_token_text_ratio=1, max_token_text_ratio=6)
    specs = [(4, 6, 5, 11), (2, 3, 0, 12), (5, 9, 12, 13), (3, 2, 1, 14)]  # text, prompt, speech, seed
    solo = [sample_all(lm, LLMRequest(prompt(*s[:3], seed=s[3]), seed=s[3], lengths=lengths)) for s in specs]
    runner = LLMRunner(lm, max_batch=2, max_len=64)
    waiting = [LLMRequest(prompt(*s[:3], seed=s[3]), seed=s[3], lengths=lengths) for s in specs]
    all_requests, running = list(waiting), []
    streamed: dict[int, list[int]] = {id(r): [] for r in waiting}
    while waiting or running:
        admit = waiting[: runner.num_free_slots]
        waiting = waiting[len(admit) :]
        batch_out = runner.decode_step(running) + runner.prefill(admit)
        for request, out in zip(running + admit, batch_out, strict=True):
            if out.token is not None:
                streamed[id(request)].append(out.token)
        running = [r for r in running + admit if not r.finished]
    assert [r.out_tokens for r in all_requests] == solo
    assert [streamed[id(r)] for r in all_requests] == solo
    assert runner.num_free_slots == 2 and any(len(t) > 2 for t in solo)


def test_bad_prompts_and_requests_raise(lm: CosyVoice3LM) -> None:
    with pytest.raises(LLMInputError):
        LLMPrompt.create([5, 6], [7, 8])  # no <|endofprompt|>
    with pytest.raises(LLMInputError):
        LLMPrompt.create([], [END_OF_PROMPT_TEXT_ID])
    with pytest.raises(LLMInputError):
        LLMPrompt.create([5], [END_OF_PROMPT_TEXT_ID], [6561])
    p = LLMPrompt.cross_lingual([5, END_OF_PROMPT_TEXT_ID, 6])
    with pytest.raises(LLMInputError):
        LLMRequest(p)  # neither seed nor generator
    runner = LLMRunner(lm, max_batch=1, max_len=8)
    with pytest.raises(LLMInputError):
        runner.prefill([LLMRequest(p, seed=0)])  # needs 5 + 59 positions
    with pytest.raises(LLMInputError):
        runner.decode_step([LLMRequest(p, seed=0)])  # never prefilled


def test_checkpoint_round_trip_and_key_errors(tmp_path, lm: CosyVoice3LM) -> None:
    path = tmp_path / "llm.pt"
    state = {("llm.model." + k if k.startswith("model.") else k): v for k, v in lm.state_dict().items()}
    state["llm.model.lm_head.weight"] = state["llm.model.model.embed_tokens.weight"]  # tied, ignored
    torch.save(state, path)
    loaded = CosyVoice3LM(TINY).eval()
    loaded.load_checkpoint(path)
    p = prompt(text_len=3, prompt_len=3, speech_len=2, seed=4)
    torch.testing.assert_close(loaded.forward_logp(p, [1, 2]), lm.forward_logp(p, [1, 2]), atol=0, rtol=0)
    del state["llm.model.model.norm.weight"]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="llm.model.model.norm.weight"):
        loaded.load_checkpoint(path)
    state["llm.model.model.norm.weight"] = torch.ones(3)
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="shape"):
        loaded.load_checkpoint(path)
