"""The speech engine: one shared engine thread per process, backends behind one contract.

Importable with torch and numpy only: nothing here knows about sockets, devices or web frameworks.
"""

from tts_engine.backends import Backend, BackendStream, available_backends, create_backend
from tts_engine.engine import SUPPORTED_SAMPLE_RATES, TTSEngine
from tts_engine.errors import EngineClosed, EngineError, EngineOverloaded, SynthesisFailed, UnknownVoice
from tts_engine.request import RequestStatus, SynthesisStream

__all__ = [
    "SUPPORTED_SAMPLE_RATES",
    "Backend",
    "BackendStream",
    "EngineClosed",
    "EngineError",
    "EngineOverloaded",
    "RequestStatus",
    "SynthesisFailed",
    "SynthesisStream",
    "TTSEngine",
    "UnknownVoice",
    "available_backends",
    "create_backend",
]
