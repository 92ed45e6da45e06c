"""Speech backends, one file each, and ``create_backend()`` to build one by name (as in config.yaml)."""

from __future__ import annotations

import importlib
from typing import Any

from tts_engine.backends.base import Backend, BackendStream

# name -> "module:class"; imported only when asked for, so a heavy backend costs nothing until used.
BACKENDS: dict[str, str] = {
    "fake": "tts_engine.backends.fake:FakeBackend",
    "gpu-sim": "tts_engine.backends.gpu_sim:GpuSimBackend",
    "espeak": "tts_engine.backends.espeak:EspeakBackend",
    "cosyvoice": "tts_engine.backends.cosyvoice.backend:CosyVoiceBackend",
}


def available_backends() -> list[str]:
    """The names ``create_backend()`` accepts."""
    return sorted(BACKENDS)


def create_backend(name: str, **options: Any) -> Backend:
    """Build the backend called ``name`` with its constructor keyword ``options``.

    Raises ``ValueError`` for an unknown name; the backend's constructor raises for bad options.
    """
    target = BACKENDS.get(name)
    if target is None:
        raise ValueError(f"unknown TTS backend {name!r}; available: {', '.join(available_backends())}")
    module_name, class_name = target.split(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    return backend_class(**options)


__all__ = ["BACKENDS", "Backend", "BackendStream", "available_backends", "create_backend"]
