"""The CosyVoice3 backend: ``backend`` (requests, admission, one step), ``voices`` (presets prepared once
and cached), ``runtime`` (device, dtype, memory plan, LLM runner, flow cache), ``request`` (one stream's
state), ``step`` (one batched engine step) and ``llm_vllm`` (the optional vLLM runner for the speech LLM)."""

from tts_engine.backends.cosyvoice.backend import SAMPLE_RATE, CosyVoiceBackend
from tts_engine.backends.cosyvoice.runtime import kv_cache_bytes, resolve_device, resolve_dtype
from tts_engine.backends.cosyvoice.voices import model_fingerprint

__all__ = [
    "SAMPLE_RATE", "CosyVoiceBackend", "kv_cache_bytes", "model_fingerprint", "resolve_device",
    "resolve_dtype",
]  # fmt: skip
