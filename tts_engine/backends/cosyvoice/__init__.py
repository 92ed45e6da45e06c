"""The CosyVoice3 backend: ``backend`` (voices, admission, memory), ``request`` (one stream's state),
``step`` (one batched engine step) and ``llm_vllm`` (the optional vLLM runner for the speech LLM)."""

from tts_engine.backends.cosyvoice.backend import (
    SAMPLE_RATE,
    CosyVoiceBackend,
    kv_cache_bytes,
    model_fingerprint,
    resolve_device,
    resolve_dtype,
)

__all__ = ["SAMPLE_RATE", "CosyVoiceBackend", "kv_cache_bytes", "model_fingerprint", "resolve_device", "resolve_dtype"]
