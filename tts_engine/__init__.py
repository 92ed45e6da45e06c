"""The speech engine: one shared engine thread per process, backends behind one contract.

Importable with torch and numpy only: nothing here knows about sockets, devices or web frameworks.
The names below are imported when first used, so a module of the package that needs no torch
(``tts_engine.settings``, which the gateway's config derives its sections from) loads without it.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tts_engine.backends import Backend, BackendStream, available_backends, create_backend
    from tts_engine.engine import TTSEngine
    from tts_engine.errors import EngineClosed, EngineError, EngineOverloaded, SynthesisFailed, UnknownVoice
    from tts_engine.interface import OUTPUT_RATES, EngineInfo, SpeechEngine, SpeechStream
    from tts_engine.request import RequestStatus, SynthesisStream

_MODULES = (
    "tts_engine.interface",
    "tts_engine.backends",
    "tts_engine.engine",
    "tts_engine.errors",
    "tts_engine.request",
)

__all__ = [
    "OUTPUT_RATES",
    "Backend",
    "BackendStream",
    "EngineClosed",
    "EngineError",
    "EngineInfo",
    "EngineOverloaded",
    "RequestStatus",
    "SpeechEngine",
    "SpeechStream",
    "SynthesisFailed",
    "SynthesisStream",
    "TTSEngine",
    "UnknownVoice",
    "available_backends",
    "create_backend",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module in _MODULES:
            value = getattr(importlib.import_module(module), name, None)
            if value is not None:
                globals()[name] = value
                return value
    raise AttributeError(f"module 'tts_engine' has no attribute {name!r}")
