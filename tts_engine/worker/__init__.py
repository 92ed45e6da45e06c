"""The engine in its own process: ``python -m tts_engine serve`` (docs/engine-workers.md).

Importable with torch, numpy and msgpack only (no web framework): a GPU box runs workers without the
gateway's dependencies.
"""

from tts_engine.worker.protocol import PROTOCOL_VERSION, FrameReader, ProtocolError, pack, parse_address
from tts_engine.worker.server import WorkerServer

__all__ = ["PROTOCOL_VERSION", "FrameReader", "ProtocolError", "WorkerServer", "pack", "parse_address"]
