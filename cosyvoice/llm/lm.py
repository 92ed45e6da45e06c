"""CosyVoice3 speech-token LM: Qwen2 backbone, speech embedding/head and prompt assembly.

Speech vocabulary: ids 0..6560 are FSQ speech codes, 6561.. are 200 special rows
(sos 6561, eos 6562, task_id 6563, fill 6564, the rest unused). Sampling any id >= 6561 ends a
request; such ids are never emitted. The LLM input is
``[sos, embed_tokens(prompt_text ++ text), task_id, speech_embedding(prompt_speech)]``.
Generation (requests, the batched runner) is :mod:`cosyvoice.llm.runner`.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from cosyvoice.checkpoint import check_keys, check_shapes, load_state_dict
from cosyvoice.llm.config import LLMConfig
from cosyvoice.llm.qwen2 import KVCache, Qwen2Config, Qwen2Model

SPEECH_TOKEN_SIZE = 6561
NUM_SPECIAL_SPEECH_IDS = 200
SOS_ID = SPEECH_TOKEN_SIZE  # 6561
EOS_ID = SPEECH_TOKEN_SIZE + 1  # 6562
TASK_ID = SPEECH_TOKEN_SIZE + 2  # 6563
FILL_ID = SPEECH_TOKEN_SIZE + 3  # 6564
END_OF_PROMPT_TEXT_ID = 151646  # <|endofprompt|>, must occur in prompt_text ++ text
QWEN_PREFIX = "llm.model.model."
IGNORED_KEYS = ("llm.model.lm_head.weight",)  # tied text head, never used


class LLMInputError(ValueError):
    """A prompt or request the LLM cannot take."""


def _checkpoint_key(module_key: str) -> str:
    """Our ``model.*`` (Hugging Face Qwen2ForCausalLM naming) -> the release's ``llm.model.model.*``."""
    return QWEN_PREFIX + module_key.removeprefix("model.") if module_key.startswith("model.") else module_key


def _module_key(checkpoint_key: str) -> str:
    if checkpoint_key.startswith(QWEN_PREFIX):
        return "model." + checkpoint_key.removeprefix(QWEN_PREFIX)
    return checkpoint_key


def _as_ids(ids: Sequence[int] | torch.Tensor, name: str) -> torch.Tensor:
    """1-D int64 CPU ids from a sequence of ints or an integer tensor [L] / [1, L]."""
    if not isinstance(ids, torch.Tensor):
        try:
            ids = torch.tensor([operator.index(v) for v in ids], dtype=torch.int64)
        except TypeError as exc:
            raise LLMInputError(f"{name} must be a sequence of integer ids") from exc
    t = ids.detach().to("cpu")
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.is_floating_point() or t.is_complex():
        raise LLMInputError(f"{name} must be a 1-D integer id sequence, got {tuple(t.shape)} {t.dtype}")
    return t.to(torch.int64)


@dataclasses.dataclass(frozen=True, slots=True)
class LLMPrompt:
    """Token-level LLM input of one request (1-D int64 CPU tensors)."""

    text: torch.Tensor  # tts text ids; its length sets min/max length
    prompt_text: torch.Tensor  # ids before the text (transcript or instruction), may be empty
    prompt_speech: torch.Tensor  # prompt speech tokens (< 6561), may be empty

    @classmethod
    def create(
        cls,
        text: Sequence[int] | torch.Tensor,
        prompt_text: Sequence[int] | torch.Tensor = (),
        prompt_speech: Sequence[int] | torch.Tensor = (),
    ) -> LLMPrompt:
        text_ids = _as_ids(text, "text")
        prompt_ids = _as_ids(prompt_text, "prompt_text")
        speech = _as_ids(prompt_speech, "prompt_speech")
        if text_ids.numel() == 0:
            raise LLMInputError("text must not be empty")
        if not bool((text_ids == END_OF_PROMPT_TEXT_ID).any() | (prompt_ids == END_OF_PROMPT_TEXT_ID).any()):
            raise LLMInputError(f"<|endofprompt|> ({END_OF_PROMPT_TEXT_ID}) missing from prompt_text + text")
        if bool((text_ids < 0).any() | (prompt_ids < 0).any()):
            raise LLMInputError("text ids must be non-negative")
        if speech.numel() and not bool(((speech >= 0) & (speech < SPEECH_TOKEN_SIZE)).all()):
            raise LLMInputError(f"prompt speech tokens must lie in 0..{SPEECH_TOKEN_SIZE - 1}")
        return cls(text_ids, prompt_ids, speech)

    @classmethod
    def zero_shot(cls, text, prompt_text, prompt_speech) -> LLMPrompt:
        """prompt_text = "You are a helpful assistant.<|endofprompt|>" + transcript ids."""
        return cls.create(text, prompt_text, prompt_speech)

    @classmethod
    def cross_lingual(cls, text) -> LLMPrompt:
        """The text itself starts with the "...<|endofprompt|>" system prefix; no prompt speech."""
        return cls.create(text)

    @classmethod
    def instruct(cls, text, instruct_text) -> LLMPrompt:
        """instruct_text ends with <|endofprompt|>; no prompt speech."""
        return cls.create(text, instruct_text)


class CosyVoice3LM(nn.Module):
    def __init__(self, config: Qwen2Config, speech_token_size: int = SPEECH_TOKEN_SIZE) -> None:
        super().__init__()
        self.speech_token_size = speech_token_size
        num_rows = speech_token_size + NUM_SPECIAL_SPEECH_IDS
        self.model = Qwen2Model(config)  # HF name of the decoder inside Qwen2ForCausalLM
        self.speech_embedding = nn.Embedding(num_rows, config.hidden_size)
        self.llm_decoder = nn.Linear(config.hidden_size, num_rows, bias=False)

    @property
    def config(self) -> Qwen2Config:
        return self.model.config

    @classmethod
    def from_config(cls, config: LLMConfig) -> CosyVoice3LM:
        """An LM of the geometry a model directory describes (weights still to load)."""
        return cls(config.backbone, speech_token_size=config.speech_token_size)

    def checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        """Our parameters under the release's ``llm.pt`` key names, with their shapes."""
        return {_checkpoint_key(key): tuple(value.shape) for key, value in self.state_dict().items()}

    def load_checkpoint(self, path: str | Path) -> None:
        """Load an official ``llm.pt``; errors name the file and the checkpoint's own key names."""
        raw = load_state_dict(path)
        wanted = {key: value for key, value in raw.items() if key not in IGNORED_KEYS}
        own_shapes = self.checkpoint_shapes()
        check_keys(own_shapes.keys(), wanted, path)
        check_shapes(own_shapes, wanted, path)
        renamed = {_module_key(key): value for key, value in wanted.items()}
        self.load_state_dict(renamed, strict=True)

    def embed_prompt(self, prompt: LLMPrompt) -> torch.Tensor:
        """The prefix embedding sequence [L, H] of one request."""
        device = self.speech_embedding.weight.device
        text = torch.cat([prompt.prompt_text, prompt.text])  # [Lp + Lt]
        if int(text.max()) >= self.config.vocab_size:
            raise LLMInputError(f"text id {int(text.max())} >= vocab size {self.config.vocab_size}")
        speech_rows = self.speech_embedding.weight
        sos, task_id = self.speech_token_size, self.speech_token_size + 2
        return torch.cat(
            [
                speech_rows[sos][None],  # [1, H]
                self.model.embed_tokens(text.to(device)),  # [Lp + Lt, H]
                speech_rows[task_id][None],  # [1, H]
                self.speech_embedding(prompt.prompt_speech.to(device)),  # [Ls, H]
            ]
        )

    def speech_logp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the 6761 speech rows, fp32: hidden [..., H] -> [..., 6761]."""
        return self.llm_decoder(hidden).float().log_softmax(dim=-1)

    def new_cache(self, *, max_batch: int, max_len: int, reserved_slots: int = 0) -> KVCache:
        return self.model.new_cache(max_batch=max_batch, max_len=max_len, reserved_slots=reserved_slots)

    @torch.inference_mode()
    def forward_logp(self, prompt: LLMPrompt, targets: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Teacher-forced log-probs [T + 1, 6761] along the KV-cached decode path: row 0 after
        the prefix, row i after feeding ``targets[i - 1]``."""
        target_ids = _as_ids(targets, "targets")
        if target_ids.numel() and not bool(
            ((target_ids >= 0) & (target_ids < self.speech_embedding.num_embeddings)).all()
        ):
            raise LLMInputError("target speech tokens out of range")
        prefix = self.embed_prompt(prompt)  # [L, H]
        cache = self.new_cache(max_batch=1, max_len=prefix.shape[0] + target_ids.numel())
        slot = cache.allocate()
        hidden = self.model(prefix[None], cache, [slot])  # [1, L, H]
        rows = [self.speech_logp(hidden[0, -1])]
        step_embeds = self.speech_embedding(target_ids.to(prefix.device))  # [T, H]
        for i in range(target_ids.numel()):
            hidden = self.model(step_embeds[i][None, None], cache, [slot])  # [1, 1, H]
            rows.append(self.speech_logp(hidden[0, -1]))
        return torch.stack(rows)  # [T + 1, 6761]
