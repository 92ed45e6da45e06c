"""What every session shares: config, the TTS engine, the LLM, ASR, metrics."""

from __future__ import annotations

import importlib
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from cosyvoice.text_normalization import TextNormalizer
from gateway.asr import ASR, create_asr
from gateway.config import Config, EngineConfig, GPUConfig, LLMConfig, TTSConfig
from gateway.llm.base import ChatLLM
from gateway.llm.echo import EchoLLM
from gateway.llm.memory import ConversationMemory
from gateway.llm.openai_chat import OpenAIChatLLM
from gateway.metrics import GatewayMetrics
from gateway.model_check import (
    CheckResult,
    asr_status_checks,
    loaded_model_checks,
    log_checks,
    tts_file_checks,
)
from tts_engine import TTSEngine
from tts_engine.backends import Backend, create_backend
from tts_engine.voices import VoiceStore

if TYPE_CHECKING:
    from gateway.session import Session

log = logging.getLogger(__name__)


@dataclass
class TTSChoice:
    backend: str
    warning: str | None = None


def choose_tts_backend(cfg: TTSConfig) -> TTSChoice:
    """Resolve `tts.backend: auto` to a backend that can run here."""
    if cfg.backend == "fake":
        return TTSChoice("fake")
    model_dir = Path(cfg.model_dir)
    if cfg.backend in ("auto", "cosyvoice"):
        if (model_dir / "cosyvoice3.yaml").is_file():
            try:
                importlib.import_module("tts_engine.backends.cosyvoice")
                return TTSChoice("cosyvoice")
            except ImportError as exc:
                reason = f"the cosyvoice backend cannot be loaded: {exc}"
        else:
            reason = f"no CosyVoice model at {model_dir} (run scripts/download_model.py)"
        if shutil.which("espeak-ng") is None:
            raise RuntimeError(f"{reason}, and espeak-ng is not installed (apt-get install espeak-ng)")
        return TTSChoice("espeak", warning=f"using espeak-ng instead of CosyVoice: {reason}")
    return TTSChoice(cfg.backend)


def create_tts_backend(
    name: str, cfg: TTSConfig, engine: EngineConfig | None = None, gpu: GPUConfig | None = None
) -> Backend:
    """Build the chosen backend with its options from the `tts` section (and the `engine` budget)."""
    if name != "cosyvoice":
        return create_backend(name)
    from gateway.asr.gpu_share import apply_process_cap
    from tts_engine.backends.cosyvoice import resolve_device
    from tts_engine.memory import MemoryBudget

    engine, gpu = engine or EngineConfig(), gpu or GPUConfig()
    device = str(resolve_device(cfg.device))
    apply_process_cap(gpu, device)  # the process-wide hard cap (the ASR applies the same one)
    budget_gib = engine.memory_gib(gpu)
    return create_backend(
        "cosyvoice",
        model_dir=cfg.model_dir,
        device=cfg.device,
        dtype=cfg.dtype,
        voice_cache_dir=Path(cfg.voices_dir) / ".cache",
        default_voice=cfg.voice,
        memory_budget=MemoryBudget.from_gib(budget_gib, device),
        max_batch_size=engine.max_batch_size,
        max_llm_len=engine.max_llm_len,
        llm_backend=engine.llm_backend,
        max_hop_rows=engine.max_hop_rows,
        cuda_graphs=engine.cuda_graphs,
        torch_compile=engine.torch_compile,
        flow_cache=engine.flow_cache,
        flow_cache_mib=engine.flow_cache_mib,
        final_pass=engine.final_pass,
    )


def set_cpu_threads(backend: str, configured: int) -> None:
    """torch's intra-op threads: OpenMP workers spin, so tiny per-chunk ops (resampling) run
    many times slower with several threads on a busy machine; only big CPU models gain."""
    threads = configured or ((os.cpu_count() or 1) if backend == "cosyvoice" else 1)
    torch.set_num_threads(threads)


def create_llm(cfg: LLMConfig) -> ChatLLM:
    if cfg.provider == "echo":
        return EchoLLM()
    return OpenAIChatLLM(
        base_url=cfg.base_url,
        api_key=cfg.api_key or None,
        model=cfg.model,
        timeout_s=cfg.timeout_s,
        first_token_timeout_s=cfg.first_token_timeout_s,
    )


@dataclass
class Services:
    config: Config
    engine: TTSEngine
    llm: ChatLLM
    asr: ASR
    metrics: GatewayMetrics
    tts_warning: str | None = None
    voices: VoiceStore | None = None  # the voice presets (registered with engines that clone voices)
    checks: list[CheckResult] = field(default_factory=list)  # start-up model checks (gateway/model_check.py)
    sessions: dict[str, Session] = field(default_factory=dict)
    memory: ConversationMemory | None = None  # per-device conversation memory (session.memory: local)
    _anonymous: int = 0

    @classmethod
    def build(
        cls,
        config: Config,
        *,
        engine: TTSEngine | None = None,
        llm: ChatLLM | None = None,
        asr: ASR | None = None,
    ) -> Services:
        warning = None
        checks: list[CheckResult] = []
        if engine is None:
            choice = choose_tts_backend(config.tts)
            warning = choice.warning
            if warning:
                log.warning("!!! %s", warning)
            set_cpu_threads(choice.backend, config.tts.cpu_threads)
            if choice.backend == "cosyvoice":  # cheap (checkpoint indexes only); problems logged with fixes
                checks = tts_file_checks(config.tts, onnx=False, tokenizer=False)
                if any(check.failed for check in checks):
                    log_checks(checks)
            backend = create_tts_backend(choice.backend, config.tts, config.engine, config.gpu)
            checks += loaded_model_checks(backend)  # the tokenizer and ONNX sessions it loaded
            engine = TTSEngine(
                backend,
                max_pending_requests=config.tts.max_pending_requests,
                max_buffered_chunks=config.tts.max_buffered_chunks,
                max_queue_wait_s=config.engine.max_queue_wait_s,
                # built here, at start-up: the wetext FSTs load once per process, not at the first request
                text_normalizer=TextNormalizer(config.tts.text_normalization),
            )
        services = cls(
            config=config,
            engine=engine,
            llm=llm or create_llm(config.llm),
            asr=asr or create_asr(config.asr, config.gpu),
            metrics=GatewayMetrics(),
            tts_warning=warning,
            voices=VoiceStore(config.tts.voices_dir),
        )
        if config.session.memory == "local":
            services.memory = ConversationMemory.open(config.session, services.llm)
        if checks:
            services.checks = checks + asr_status_checks(services.asr)
            log_checks(services.checks)
        services.metrics.watch_engine(lambda: services.engine.stats)
        return services

    async def start(self) -> None:
        await self.engine.start()
        await self.register_voices()

    async def register_voices(self) -> None:
        """Load the voice presets and prepare each in the engine (backends that clone voices only)."""
        if self.voices is None or not self.engine.supports_cloning:
            return
        for preset in self.voices.load():
            try:
                await self.engine.add_voice(preset)
            except Exception as exc:  # a preset the backend cannot use is skipped; the server starts
                log.warning("voice %r is not available: %s", preset.name, exc)
        if self.config.tts.voice not in self.engine.voices:
            log.warning(
                "!!! the configured voice %r is not available (voices: %s); add %s/%s.yaml",
                self.config.tts.voice,
                ", ".join(self.engine.voices) or "none",
                self.config.tts.voices_dir,
                self.config.tts.voice,
            )

    async def close(self) -> None:
        for session in list(self.sessions.values()):
            await session.close()
        await self.engine.close()
        if self.memory is not None:
            await self.memory.aclose()  # pending writes land first (bounded)
        aclose = getattr(self.llm, "aclose", None)
        if aclose is not None:
            await aclose()
        await self.asr.aclose()

    def session_key(self, device_id: str | None) -> str:
        if device_id:
            return device_id
        self._anonymous += 1
        return f"anonymous-{self._anonymous}"

    def _asr_warning(self) -> str | None:
        warning = getattr(self.asr, "warning", None)
        if warning is None and self.asr.name == "none":
            return "speech recognition is not configured (asr.backend: none); typed text still works"
        return warning

    def health(self) -> dict[str, Any]:
        engine = self.engine.health()
        failed_check = any(check.failed for check in self.checks)
        status = "degraded" if self.tts_warning or failed_check else "ok"
        return {
            "status": status,
            "sessions": len(self.sessions),
            "tts": {**engine, "warning": self.tts_warning},
            "llm": {"provider": self.config.llm.provider},
            "asr": {"backend": self.asr.name, "warning": self._asr_warning()},
            "audio": {"output_sample_rate": self.config.audio.output_sample_rate},
            "checks": [check.as_dict() for check in self.checks],
        }
