"""Which devices have a live session: the device socket's registry (gateway/device/socket.py).

Only the socket endpoint admits, replaces and releases sessions; everyone else (health, status,
the memory API, shutdown) reads it as a mapping from the session key (the Device-Id, or an
`anonymous-N` key for a device that sent none) to its session.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar


class LiveSession(Protocol):
    """What the registry and its readers need of a session (gateway/device/session.py's ``Session``), so that
    the registry, which ``Services`` holds, does not import the session, which imports ``Services``."""

    @property
    def info(self) -> Any: ...  # its handshake (``info.authenticated``)

    @property
    def mode(self) -> Any: ...  # its listen mode (/v1/status)

    def forget_history(self) -> None:
        """Drop the conversation so far (DELETE /v1/devices/{id}/memory)."""

    async def close(self, code: int = 1000) -> None: ...


Session = TypeVar("Session", bound=LiveSession)


class SessionRegistry(Mapping[str, Session], Generic[Session]):
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._anonymous = 0

    def key_for(self, device_id: str | None) -> str:
        """The session's key: its Device-Id, or a fresh anonymous key."""
        if device_id:
            return device_id
        self._anonymous += 1
        return f"anonymous-{self._anonymous}"

    def may_replace(self, key: str, *, authenticated: bool) -> bool:
        """A Device-Id is no secret: only a connection with a valid token may replace one that had one."""
        old = self._sessions.get(key)
        return old is None or authenticated or not old.info.authenticated

    def claim(self, key: str, session: Session) -> Session | None:
        """Makes `session` the device's live one (no await: no race with another upgrade); returns the one
        it replaces, which the caller closes."""
        old = self._sessions.get(key)
        self._sessions[key] = session
        return old

    def release(self, key: str, session: Session) -> None:
        """The session ended; a newer session of the same device keeps its place."""
        if self._sessions.get(key) is session:
            del self._sessions[key]

    async def close_all(self) -> None:
        for session in list(self._sessions.values()):
            await session.close()

    def __getitem__(self, key: str) -> Session:
        return self._sessions[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)
