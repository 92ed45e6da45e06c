"""Export the CosyVoice3 speech LM (``llm.pt``) as a stock Hugging Face ``Qwen2ForCausalLM`` directory.

The exported model works over the *speech* vocabulary only, which is what a serving engine such as vLLM
needs when it is fed prompt embeddings and then decodes speech tokens on its own:

- ``model.embed_tokens`` is the LM's ``speech_embedding`` (6761 rows), so a sampled speech id fed back
  by the engine gets the same input embedding as in our decode loop;
- ``lm_head`` is ``llm_decoder`` (6761 x hidden, no bias), applied to the post-final-norm state, so the
  engine's logits are our speech logits;
- ``vocab_size`` = 6761, ``tie_word_embeddings`` = false, no bos/eos ids (the caller sets stop ids).

The Qwen text embedding (151936 rows) is not exported: text is embedded by the caller
(:meth:`cosyvoice.llm.CosyVoice3LM.embed_prompt`) and passed as prompt embeddings. Files written:
``config.json``, ``generation_config.json`` (no sampling defaults, so none leak into an engine),
``model.safetensors`` and ``cosyvoice_export.json`` (the speech-id layout for our own loaders). No
tokenizer files: the engine must run with its tokenizer disabled (vLLM: ``skip_tokenizer_init=True``).

Upstream's exporter writes bf16; we keep the requested ``dtype`` (float32 by default, lossless).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from cosyvoice.config import load_config
from cosyvoice.files import read_json_object
from cosyvoice.llm import CosyVoice3LM

__all__ = [
    "EXPORT_FORMAT",
    "ExportError",
    "export_qwen2_hf",
    "hf_config",
    "hf_state_dict",
    "read_export_info",
]

EXPORT_FORMAT = "cosyvoice3-speech-qwen2/1"
EXPORT_INFO_FILE = "cosyvoice_export.json"
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# BlankEN keys that describe the text vocabulary or generation, meaningless for the speech-only model
_DROPPED_CONFIG_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "dtype", "torch_dtype")


class ExportError(RuntimeError):
    """The export cannot be written (bad dtype, output directory in the way, unreadable model)."""


def _parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        by_name = {name: dt for dt, name in _DTYPE_NAMES.items()} | {
            "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
        }  # fmt: skip
        if dtype not in by_name:
            raise ExportError(f"dtype must be one of {sorted(by_name)}, got {dtype!r}")
        return by_name[dtype]
    if dtype not in _DTYPE_NAMES:
        raise ExportError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    return dtype


def hf_state_dict(lm: CosyVoice3LM, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """HF ``Qwen2ForCausalLM`` tensors of ``lm`` over the speech vocabulary (fresh contiguous CPU copies)."""
    own = lm.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, value in own.items():
        if key.startswith("model.") and key != "model.embed_tokens.weight":
            out[key] = value
    out["model.embed_tokens.weight"] = own["speech_embedding.weight"]  # [6761, H]
    out["lm_head.weight"] = own["llm_decoder.weight"]  # [6761, H]
    # safetensors refuses shared storage; clone so no two entries alias
    return {key: value.detach().to("cpu", dtype).contiguous().clone() for key, value in out.items()}


def hf_config(blank_en_config: dict[str, Any], lm: CosyVoice3LM, dtype: torch.dtype) -> dict[str, Any]:
    """BlankEN's ``config.json`` rewritten for the speech-only model."""
    config = {k: v for k, v in blank_en_config.items() if k not in _DROPPED_CONFIG_KEYS}
    config.update(
        lm.config.to_dict(),  # the backbone geometry, under Hugging Face's key names
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_act="silu",
        vocab_size=lm.speech_embedding.num_embeddings,
        tie_word_embeddings=False,
        use_sliding_window=False,
        torch_dtype=_DTYPE_NAMES[dtype],
    )
    return config


def _export_info(lm: CosyVoice3LM, llm_file: Path, dtype: torch.dtype) -> dict[str, Any]:
    size = lm.speech_token_size
    return {
        "format": EXPORT_FORMAT,
        "source": llm_file.name,
        "dtype": _DTYPE_NAMES[dtype],
        "speech_token_size": size,  # ids below this are speech codes, the rest stop the generation
        "speech_vocab_size": lm.speech_embedding.num_embeddings,
        "sos_id": size,
        "eos_id": size + 1,
        "task_id": size + 2,
        "fill_id": size + 3,
        "text_vocab_size": lm.config.vocab_size,  # text ids are embedded by the caller, not in the export
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def export_qwen2_hf(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | str = torch.float32,
    use_rl_llm: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write ``model_dir``'s speech LM (``llm.pt``, or ``llm.rl.pt`` with ``use_rl_llm``) as a Hugging
    Face Qwen2 directory at ``out_dir`` and return its path.

    The directory appears complete or not at all (written beside it, then renamed). An existing
    ``out_dir`` is an error unless ``overwrite``.
    """
    target_dtype = _parse_dtype(dtype)
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise ExportError(f"{out} already exists (pass overwrite=True to replace it)")
    config = load_config(model_dir)
    llm_file = config.files.llm_rl if use_rl_llm else config.files.llm
    lm = CosyVoice3LM.from_config(config.llm)
    lm.load_checkpoint(llm_file)  # CheckpointError names the file and key on a mismatch
    blank_en = read_json_object(config.files.blank_en / "config.json", ExportError)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part"))
    try:
        save_file(hf_state_dict(lm, target_dtype), staging / "model.safetensors", metadata={"format": "pt"})
        _write_json(staging / "config.json", hf_config(blank_en, lm, target_dtype))
        _write_json(staging / "generation_config.json", {"do_sample": True})
        _write_json(staging / EXPORT_INFO_FILE, _export_info(lm, llm_file, target_dtype))
        for path in staging.iterdir():
            path.chmod(0o644)  # mkdtemp / safetensors create private files; an export is shared data
        staging.chmod(0o755)
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def read_export_info(export_dir: str | Path) -> dict[str, Any]:
    """The ``cosyvoice_export.json`` of an export directory (checks its format tag)."""
    path = Path(export_dir) / EXPORT_INFO_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path}: not a CosyVoice3 HF export ({exc})") from exc
    if info.get("format") != EXPORT_FORMAT:
        raise ExportError(f"{path}: format {info.get('format')!r}, expected {EXPORT_FORMAT!r}")
    return info
