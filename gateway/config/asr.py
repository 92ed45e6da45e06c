"""Speech recognition: the ASR model, its batching and echo cancellation, and the VAD."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.config.base import Section


class VADConfig(Section):
    """Silero VAD endpointing (auto and realtime modes, barge-in)."""

    threshold: float = Field(0.5, gt=0, lt=1)
    threshold_low: float = Field(0.3, gt=0, lt=1)
    min_speech_ms: int = Field(160, ge=0, le=5000)
    min_silence_ms: int = Field(400, ge=32, le=10000)
    pre_roll_ms: int = Field(300, ge=0, le=2000)
    detect_mute_s: float = Field(2.0, ge=0, le=30)

    @model_validator(mode="after")
    def _hysteresis(self) -> VADConfig:
        if self.threshold_low > self.threshold:
            raise ValueError("threshold_low must be <= threshold")
        return self


class ASRConfig(Section):
    backend: Literal["auto", "funasr", "none"] = "auto"
    model: str = "auto"  # models/SenseVoiceSmall when present, else iic/SenseVoiceSmall
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    language: Literal["auto", "zh", "en", "yue", "ja", "ko"] = "auto"
    use_itn: bool = True
    download: bool = True
    load_timeout_s: float = Field(900, gt=0)
    on_load_failure: Literal["error", "not_configured"] = "error"
    threads: int = Field(1, ge=0, le=256)
    max_batch: int = Field(8, ge=1, le=256)
    max_batch_audio_s: float = Field(120, gt=0)
    max_queue: int = Field(64, ge=1)
    min_utterance_s: float = Field(0.5, ge=0, le=10)
    # Server-side echo cancellation of the uplink against our own reply (gateway/aec). `auto`: for
    # devices whose hello says features.aec (firmware built with CONFIG_USE_SERVER_AEC: the device
    # leaves echo cancellation to the server). With it on, realtime mode barges in on speech onset.
    aec: Literal["auto", "on", "off"] = "auto"
    # A linear canceller (SpeexDSP) beside AEC3 whose echo estimate detects the user talking over the
    # reply and passes them unsuppressed: barge-in found sooner (gateway/aec/stages.py); off: AEC3 alone
    aec_double_talk: bool = True
    not_configured_reply: str = "语音识别还没有配置，请直接输入文字。"
    vad: VADConfig = Field(default_factory=VADConfig)

