"""The speech engine: one shared engine thread per process, backends behind one contract.

Importable with torch and numpy only: nothing here knows about sockets, devices or web frameworks.
"""

from tts_engine.backends import Backend, BackendStream, available_backends, create_backend
from tts_engine.engine import TTSEngine
from tts_engine.errors import EngineClosed, EngineError, EngineOverloaded, SynthesisFailed, UnknownVoice
from tts_engine.interface import OUTPUT_RATES, EngineInfo, SpeechEngine, SpeechStream
from tts_engine.request import RequestStatus, SynthesisStream

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
