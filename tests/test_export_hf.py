"""The Hugging Face Qwen2 export of the speech LM, loaded with ``transformers``, gives our LLM's log-probs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from cosyvoice.checkpoint import CheckpointError
from cosyvoice.llm import END_OF_PROMPT_TEXT_ID, CosyVoice3LM, LLMPrompt
from cosyvoice.pretrained import load_llm
from cosyvoice.tools.export_hf import ExportError, export_qwen2_hf, read_export_info
from scripts.export_llm_hf import main as export_main
from scripts.make_tiny_model import make_model_dir

TOL = 1e-4
PROMPTS = {
    "zero_shot": LLMPrompt.create([5, END_OF_PROMPT_TEXT_ID, 7, 9, 120000], [11, 12], [3, 4, 5, 6560]),
    "no_prompt_speech": LLMPrompt.create([END_OF_PROMPT_TEXT_ID, 42, 43]),
}
TARGETS = torch.tensor([1, 2, 2, 100, 6000, 6560, 17])  # fed back after the prefix, as a decode loop would


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("cosy") / "model", preset="tiny", seed=3, onnx_models=False)


@pytest.fixture(scope="module")
def export_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_qwen2_hf(model_dir, tmp_path_factory.mktemp("export") / "hf")


@pytest.fixture(scope="module")
def lm(model_dir: Path) -> CosyVoice3LM:
    return load_llm(model_dir)


def hf_logp(hf_dir: Path, lm: CosyVoice3LM, prompt: LLMPrompt, targets: torch.Tensor) -> torch.Tensor:
    """Log-probs [T + 1, V] from the exported model, driven as a prompt-embeds engine drives it:
    the prefix as input embeddings, then the fed-back speech ids through the export's own embedding."""
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    with torch.inference_mode():
        prefix = lm.embed_prompt(prompt)  # [L, H]
        first = hf(inputs_embeds=prefix[None], use_cache=True)
        rest = hf(input_ids=targets[None], past_key_values=first.past_key_values, use_cache=True)
        logits = torch.cat([first.logits[0, -1:], rest.logits[0]])  # [T + 1, V]
    return logits.float().log_softmax(dim=-1)


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_export_reproduces_native_log_probs(export_dir: Path, lm: CosyVoice3LM, name: str) -> None:
    prompt = PROMPTS[name]
    ours = lm.forward_logp(prompt, TARGETS)  # [T + 1, 6761]
    theirs = hf_logp(export_dir, lm, prompt, TARGETS)
    assert theirs.shape == ours.shape == (TARGETS.numel() + 1, 6761)
    assert (theirs - ours).abs().max().item() < TOL


def _corrupt_swap_heads(hf_dir: Path) -> None:
    """The classic mistake: lm_head and embed_tokens the wrong way round."""
    tensors = load_file(hf_dir / "model.safetensors")
    tensors["lm_head.weight"], tensors["model.embed_tokens.weight"] = (
        tensors["model.embed_tokens.weight"].clone(),
        tensors["lm_head.weight"].clone(),
    )
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})


def _corrupt_rope_theta(hf_dir: Path) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    config["rope_theta"] = 10000.0
    (hf_dir / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("corrupt", [_corrupt_swap_heads, _corrupt_rope_theta])
def test_corrupted_export_does_not_match(model_dir: Path, lm: CosyVoice3LM, tmp_path: Path, corrupt) -> None:
    bad = export_qwen2_hf(model_dir, tmp_path / "bad")
    corrupt(bad)
    prompt = PROMPTS["zero_shot"]
    diff = (hf_logp(bad, lm, prompt, TARGETS) - lm.forward_logp(prompt, TARGETS)).abs().max().item()
    assert diff > 100 * TOL


def test_export_layout(export_dir: Path, lm: CosyVoice3LM) -> None:
    config = json.loads((export_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["vocab_size"] == 6761 and config["tie_word_embeddings"] is False
    assert "bos_token_id" not in config and "eos_token_id" not in config
    generation = json.loads((export_dir / "generation_config.json").read_text())
    assert "eos_token_id" not in generation and "top_k" not in generation
    tensors = load_file(export_dir / "model.safetensors")
    assert torch.equal(tensors["model.embed_tokens.weight"], lm.speech_embedding.weight.detach())
    assert torch.equal(tensors["lm_head.weight"], lm.llm_decoder.weight.detach())
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert not any("speech_embedding" in k or "llm_decoder" in k for k in tensors)
    info = read_export_info(export_dir)
    assert (info["sos_id"], info["eos_id"], info["task_id"], info["speech_token_size"]) == (
        6561, 6562, 6563, 6561,
    )  # fmt: skip


def test_bf16_export(model_dir: Path, lm: CosyVoice3LM, tmp_path: Path) -> None:
    out = export_qwen2_hf(model_dir, tmp_path / "bf16", dtype="bfloat16")
    tensors = load_file(out / "model.safetensors")
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    expected = lm.llm_decoder.weight.detach().to(torch.bfloat16)
    assert torch.equal(tensors["lm_head.weight"], expected)


def test_existing_output_is_refused_unless_overwrite(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match="already exists"):
        export_qwen2_hf(model_dir, out)
    assert (out / "keep.txt").exists()
    export_qwen2_hf(model_dir, out, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()


def test_bad_arguments_raise_typed_errors(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="dtype"):
        export_qwen2_hf(model_dir, tmp_path / "a", dtype="int8")
    with pytest.raises(CheckpointError, match=r"llm\.rl\.pt"):
        export_qwen2_hf(model_dir, tmp_path / "b", use_rl_llm=True)
    assert not (tmp_path / "b").exists()
    (tmp_path / "c").mkdir()
    with pytest.raises(ExportError, match="not a CosyVoice3 HF export"):
        read_export_info(tmp_path / "c")


def test_cli(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert export_main([str(model_dir), str(out), "--dtype", "float16"]) == 0
    assert read_export_info(out)["dtype"] == "float16"
    assert export_main([str(model_dir), str(out)]) == 1
    assert "already exists" in capsys.readouterr().err
