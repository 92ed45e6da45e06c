"""Which TTS backend this process runs (``tts.backend: auto`` resolved) and building it beside the ASR.

Used by the gateway's services at start-up and by ``gateway check`` (gateway/checks/model.py), which
builds the backend the same way to load-test it.
"""

from __future__ import annotations

import importlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from gateway.config import EngineConfig, GPUConfig, TTSConfig
from tts_engine.backends import Backend
from tts_engine.build import build_backend
from tts_engine.settings import EngineSettings, GPUSettings, Settings


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
    """Build the chosen backend for this process (the engine beside the ASR), as a worker would."""
    settings = Settings(
        tts=cfg.to_settings(),
        engine=EngineSettings() if engine is None else engine.to_settings(),
        gpu=GPUSettings() if gpu is None else gpu.to_settings(),
    )
    return build_backend(name, cfg.device, settings, own_process=False)


def set_cpu_threads(backend: str, configured: int) -> None:
    """torch's intra-op threads: OpenMP workers spin, so tiny per-chunk ops (resampling) run
    many times slower with several threads on a busy machine; only big CPU models gain."""
    threads = configured or ((os.cpu_count() or 1) if backend == "cosyvoice" else 1)
    torch.set_num_threads(threads)
