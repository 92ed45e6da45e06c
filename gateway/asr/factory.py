"""Which recogniser runs: ``create_asr`` builds the one ``asr.backend`` asks for (the VAD's model is
loaded here too: a missing one stops the start-up). Apart from base.py so that the interface does not
import its FunASR implementation (which imports the interface)."""

from __future__ import annotations

import importlib.util
import logging

from gateway.asr.base import ASR, ASRLoadError, NotConfiguredASR
from gateway.config import ASRConfig, GPUConfig

log = logging.getLogger(__name__)


def funasr_installed() -> bool:
    return importlib.util.find_spec("funasr") is not None


def create_asr(cfg: ASRConfig | str, gpu: GPUConfig | None = None) -> ASR:
    """The recognizer `cfg.backend` asks for (see config.yaml, section asr).

    `auto` never fails: without FunASR or its model it gives the 'not configured'
    backend and logs why. `funasr` raises `ASRLoadError` unless
    `on_load_failure: not_configured`. Raises `VADUnavailable` when the Silero
    VAD model (a core dependency) cannot be loaded.
    """
    if isinstance(cfg, str):
        cfg = ASRConfig(backend=cfg)
    from gateway.asr.vad import SileroVAD

    SileroVAD.shared()  # the VAD of every session: a missing model file stops the start-up here
    if cfg.backend == "none":
        return NotConfiguredASR()
    if cfg.backend == "auto" and not funasr_installed():
        return _off("FunASR is not installed (scripts/setup.sh installs it)")
    from gateway.asr.funasr_backend import FunASRBackend  # imports torch; only when needed

    try:
        if cfg.backend == "auto":
            FunASRBackend.locate_model(cfg)  # cheap: no download attempt without a place to get it
        return FunASRBackend.load(cfg, gpu)
    except ASRLoadError as exc:
        if cfg.backend == "auto" or cfg.on_load_failure == "not_configured":
            return _off(str(exc))
        raise


def _off(reason: str) -> NotConfiguredASR:
    log.warning("!!! speech recognition is off: %s", reason)
    return NotConfiguredASR(reason)
