"""What the speech LM is: its Qwen2 backbone, its speech vocabulary and its sampling defaults.

:func:`cosyvoice.config.load_config` fills these from a model directory (the backbone from BlankEN's
``config.json``, the rest from ``cosyvoice3.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass

from cosyvoice.llm.qwen2 import Qwen2Config

__all__ = ["LLMConfig", "SamplingConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMConfig:
    """The Qwen2 backbone (BlankEN's ``config.json``) plus the CosyVoice3LM speech vocabulary."""

    backbone: Qwen2Config
    speech_token_size: int  # FSQ codes 0..speech_token_size-1 (6561)
    num_speech_special: int = 200  # rows after the codes: sos, eos, task_id, fill, then unused
    mix_ratio: tuple[int, int] = (5, 15)
    endofprompt_id: int = 151646  # hard-coded upstream

    @property
    def hidden_size(self) -> int:
        return self.backbone.hidden_size

    @property
    def num_layers(self) -> int:
        return self.backbone.num_hidden_layers

    @property
    def num_attention_heads(self) -> int:
        return self.backbone.num_attention_heads

    @property
    def num_key_value_heads(self) -> int:
        return self.backbone.num_key_value_heads

    @property
    def head_dim(self) -> int:
        return self.backbone.head_dim

    @property
    def intermediate_size(self) -> int:
        return self.backbone.intermediate_size

    @property
    def text_vocab_size(self) -> int:
        """Rows of embed_tokens (151936 in the release)."""
        return self.backbone.vocab_size

    @property
    def rope_theta(self) -> float:
        return self.backbone.rope_theta

    @property
    def speech_vocab_size(self) -> int:
        """Rows of speech_embedding and llm_decoder (6761)."""
        return self.speech_token_size + self.num_speech_special

    @property
    def sos_id(self) -> int:
        return self.speech_token_size

    @property
    def eos_id(self) -> int:
        return self.speech_token_size + 1

    @property
    def task_id(self) -> int:
        return self.speech_token_size + 2

    @property
    def fill_id(self) -> int:
        return self.speech_token_size + 3


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingConfig:
    """RAS sampling and the text-length based generation limits."""

    top_p: float
    top_k: int
    win_size: int
    tau_r: float
    min_token_text_ratio: float = 2.0  # hard-coded upstream
    max_token_text_ratio: float = 20.0  # hard-coded upstream
    silent_tokens: tuple[int, ...] = (1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323)
    max_silent_run: int = 5  # silent tokens beyond this run length never reach the flow
