"""CosyVoice3 speech LM stage: the Qwen2 backbone (``qwen2``), the LM and its prompts (``lm``), RAS
sampling (``sampling``), batched generation (``runner``) and its static-shape decode step for CUDA graphs
(``graph_decode``)."""

from cosyvoice.llm.config import LLMConfig, SamplingConfig
from cosyvoice.llm.lm import (
    END_OF_PROMPT_TEXT_ID,
    EOS_ID,
    SOS_ID,
    SPEECH_TOKEN_SIZE,
    CosyVoice3LM,
    LLMInputError,
    LLMPrompt,
)
from cosyvoice.llm.runner import (
    LengthRule,
    LLMRequest,
    LLMRunner,
    StepOutput,
    check_new_requests,
    check_running_requests,
    generate,
    sampling_from_config,
)

__all__ = [
    "END_OF_PROMPT_TEXT_ID", "EOS_ID", "SOS_ID", "SPEECH_TOKEN_SIZE", "CosyVoice3LM", "LLMConfig",
    "LLMInputError", "LLMPrompt", "LLMRequest", "LLMRunner", "LengthRule", "SamplingConfig", "StepOutput",
    "check_new_requests", "check_running_requests", "generate", "sampling_from_config",
]  # fmt: skip
