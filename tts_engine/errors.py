"""The engine's exception tree.

    EngineError
    ├── EngineOverloaded   too many live + queued requests (synthesize() raises it at once), or a request
    │                      waited max_queue_wait_s for backend capacity (its stream raises it)
    ├── UnknownVoice       the voice is not offered by the backend; raised by synthesize()
    ├── EngineClosed       the engine is closed (or closing); open streams raise it
    ├── SynthesisFailed    the backend raised for one request; only that stream raises it
    └── EngineUnavailable  no engine worker can take a request now (gateway/engine_client/client.py)
        └── WorkerLost     the engine worker serving a request went away (process exit, socket EOF)

Invalid arguments (a sample rate we do not serve, a bad speed) raise ``ValueError``.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of everything the engine raises on purpose."""


class EngineOverloaded(EngineError):
    """More than ``max_pending_requests`` requests are live or queued, or one waited too long for capacity."""


class UnknownVoice(EngineError):
    """The requested voice is not one of the backend's voices."""

    def __init__(self, voice: str, available: list[str]) -> None:
        super().__init__(f"unknown voice {voice!r}; available: {', '.join(available)}")
        self.voice = voice
        self.available = list(available)


class EngineClosed(EngineError):
    """The engine is closed; no new requests, and open streams end with this error."""


class SynthesisFailed(EngineError):
    """The backend failed for one request. The cause is chained as ``__cause__``."""

    def __init__(self, req_id: str, cause: BaseException) -> None:
        super().__init__(f"synthesis failed for request {req_id}: {cause!r}")
        self.req_id = req_id
        self.cause = cause
        self.__cause__ = cause


class EngineUnavailable(EngineError):
    """No engine worker is connected that can take the request (all down or restarting)."""


class WorkerLost(EngineUnavailable):
    """The engine worker serving this request went away; only its in-flight requests fail."""
