"""The engine interface (``SpeechEngine``) over engine worker processes: ``EngineClient`` (client.py),
one connection to a worker (link.py), starting and watching workers (workers.py), building it from the
config (build.py). docs/engine-workers.md."""

from gateway.engine_client.client import EngineClient

__all__ = ["EngineClient"]
