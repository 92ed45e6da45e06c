"""Per-device conversation memory (``session.memory: local``): saved after each turn, restored at hello.

The history lives in the gateway's store (``gateway/llm/memory_store.py`` on ``gateway/store``: SQLite
by default, PostgreSQL to let a device's memory follow it to any gateway), every call bounded by
``store.timeout_s``. When the store is down, a device's hello restores nothing and its exchanges are not
saved (each logged); its turns go on as usual, never waiting longer than that bound.
A device keeps fewer than ``session.memory_max_messages`` messages (user + assistant, two per
exchange) at rest: when it reaches the limit, the oldest exchanges are folded into one summary
written by the chat model (one ``stream_chat`` call, output capped at ``memory_summary_max_chars``,
within ``memory_summary_timeout_s``), so the newest quarter of the limit stays word for word. If the
model fails or is too slow, those exchanges are dropped and the old summary stays: the history is
truncated instead, never unbounded, and the turn never waits for any of it.

What is saved is what the session's own history keeps: the user's text and the reply as far as it
was generated; an aborted reply is saved as far as it got, a turn with no reply text not at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from gateway.config import DEFAULT_CONFIG_PATH, SessionConfig
from gateway.llm.base import ChatLLM
from gateway.llm.memory_store import DeviceMemory, LegacyImport, MemoryStore, import_legacy_file
from gateway.store import Store, StoreError

__all__ = ["ConversationMemory", "DeviceMemory", "SUMMARY_PROMPT", "resolve_memory_path"]

log = logging.getLogger(__name__)

SUMMARY_PROMPT = (
    "You keep the long-term memory of a voice assistant. Summarise the conversation below in a few "
    "short sentences, in the language the user speaks. Keep every fact about the user (name, family, "
    "preferences, plans) and anything the assistant promised; drop small talk. If an earlier summary "
    "is given, merge it in. Answer with the summary only."
)
MAX_LINE_CHARS = 2000  # of one message in the transcript sent to be summarised
CLOSE_WAIT_S = 5.0  # how long shutting down waits for pending writes


def resolve_memory_path(path: str) -> Path:
    """``session.memory_path`` (the memory file of gateways before the store, imported once at start):
    absolute, or relative to the project root (where config.yaml is)."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else DEFAULT_CONFIG_PATH.parent / candidate


class ConversationMemory:
    """Remembers each device's talk across connections and restarts; async front of ``MemoryStore``.

    Writes for one device run in order (each waits for the one before); ``restore`` waits for them,
    so a device that reconnects right after a turn finds that turn.
    """

    def __init__(
        self,
        store: MemoryStore,
        llm: ChatLLM,
        *,
        max_messages: int = 40,
        summary_timeout_s: float = 20.0,
        summary_max_chars: int = 1000,
        legacy_path: Path | None = None,
    ) -> None:
        self._store = store
        self._legacy_path = legacy_path
        self._llm = llm
        self.max_turns = max(2, max_messages // 2)
        self.keep_turns = max(1, max_messages // 4)  # left word for word after a fold
        self._summary_timeout_s = summary_timeout_s
        self._summary_max_chars = summary_max_chars
        self._writes: dict[str, asyncio.Task[None]] = {}  # the latest write of each device
        self._folds: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @classmethod
    def open(cls, cfg: SessionConfig, llm: ChatLLM, store: Store) -> ConversationMemory:
        """The memory on ``store`` (opened by the caller), with the session section's limits."""
        return cls(
            MemoryStore(store),
            llm,
            max_messages=cfg.memory_max_messages,
            summary_timeout_s=cfg.memory_summary_timeout_s,
            summary_max_chars=cfg.memory_summary_max_chars,
            legacy_path=resolve_memory_path(cfg.memory_path),
        )

    async def start(self) -> LegacyImport | None:
        """Imports the pre-store memory file, if there is one (once; see memory_store.import_legacy_file).

        A store that is down leaves the file for the next start (logged); the gateway starts anyway."""
        path = self._legacy_path
        if path is None or not path.is_file():
            return None
        try:
            return await import_legacy_file(self._store.store, path)
        except StoreError as exc:
            log.warning("memory file %s not imported now (%s); the next start tries again", path, exc)
            return None

    async def restore(self, device_id: str) -> DeviceMemory:
        """The device's summary and newest exchanges (at most ``max_turns``); empty on any error."""
        await self._written(device_id)
        try:
            memory = await self._store.load(device_id)
        except StoreError as exc:
            log.warning("memory of %s not restored: %s", device_id, exc)
            return DeviceMemory()
        return DeviceMemory(memory.summary, memory.turns[-self.max_turns :], memory.last_id)

    def remember(
        self, device_id: str, user_text: str, assistant_text: str, *, summary_max_chars: int | None = None
    ) -> None:
        """Saves an exchange in the background (never blocks, never raises). ``summary_max_chars``: the
        length of the summary this exchange may lead to (the device's agent's; default the config's)."""
        if self._closed or not user_text.strip() or not assistant_text.strip():
            return
        previous = self._writes.get(device_id)
        limit = summary_max_chars or self._summary_max_chars
        task = asyncio.create_task(
            self._append(device_id, user_text.strip(), assistant_text.strip(), previous, limit)
        )
        self._writes[device_id] = task
        self._track(task)
        task.add_done_callback(
            lambda t: self._writes.pop(device_id) if self._writes.get(device_id) is t else None
        )

    async def delete(self, device_id: str) -> bool:
        """Forgets the device (pending writes land first; a summary in progress is dropped)."""
        await self._written(device_id)
        fold = self._folds.pop(device_id, None)
        if fold is not None:
            fold.cancel()
        return await self._store.delete(device_id)  # StoreError: the caller's (the API answers 503)

    async def settle(self) -> None:
        """Waits until every pending write and summary is done (tests, shutdown)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def aclose(self) -> None:
        """Stops taking writes, lets pending ones land (bounded), drops summaries in progress."""
        self._closed = True
        for task in self._folds.values():
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CLOSE_WAIT_S)
        for task in self._tasks:
            task.cancel()  # the store itself is closed by its owner (Services), after this

    # ---- background work -------------------------------------------------------

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _written(self, device_id: str) -> None:
        task = self._writes.get(device_id)
        if task is not None:
            await asyncio.wait([task])

    async def _append(
        self,
        device_id: str,
        user_text: str,
        assistant_text: str,
        previous: asyncio.Task[None] | None,
        summary_max_chars: int,
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        try:
            count = await self._store.append(device_id, user_text, assistant_text)
        except StoreError as exc:
            log.warning("memory of %s not saved: %s", device_id, exc)
            return
        if count >= self.max_turns and device_id not in self._folds and not self._closed:
            fold = asyncio.create_task(self._fold(device_id, summary_max_chars))
            self._folds[device_id] = fold
            self._track(fold)
            fold.add_done_callback(
                lambda t: self._folds.pop(device_id) if self._folds.get(device_id) is t else None
            )

    async def _fold(self, device_id: str, summary_max_chars: int) -> None:
        """Folds all but the newest ``keep_turns`` exchanges into the summary (or drops them).

        Goes on while exchanges saved during a fold keep the device at the limit.
        """
        try:
            while (count := await self._store.count(device_id)) >= self.max_turns:
                old, up_to = await self._store.oldest(device_id, count - self.keep_turns)
                summary = await self._summarise(old, summary_max_chars)
                if summary is None:
                    log.warning(
                        "memory of %s: no summary; %d old exchanges dropped", device_id, len(old.turns)
                    )
                if not await self._store.fold(device_id, up_to, summary):
                    return  # deleted meanwhile
        except StoreError as exc:
            log.warning("memory of %s not summarised: %s", device_id, exc)

    async def _summarise(self, memory: DeviceMemory, max_chars: int | None = None) -> str | None:
        """The model's summary of ``memory`` (bounded length), or None when it fails or is too slow."""
        lines = [f"Earlier summary: {memory.summary[:MAX_LINE_CHARS]}"] if memory.summary else []
        for user, assistant in memory.turns:
            lines += [f"User: {user[:MAX_LINE_CHARS]}", f"Assistant: {assistant[:MAX_LINE_CHARS]}"]
        messages = [
            {"role": "system", "content": SUMMARY_PROMPT},
            {"role": "user", "content": "\n".join(lines)},
        ]
        parts: list[str] = []
        max_chars = max_chars or self._summary_max_chars
        try:
            async with asyncio.timeout(self._summary_timeout_s):
                stream = self._llm.stream_chat(messages)
                try:
                    size = 0
                    async for delta in stream:
                        parts.append(delta)
                        size += len(delta)
                        if size >= max_chars:
                            break
                finally:
                    await _close_stream(stream)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # LLMError, a timeout, or any failure of a model client
            log.warning("memory summary failed: %s", exc or type(exc).__name__)
            return None
        summary = "".join(parts).strip()[:max_chars]
        return summary or None


async def _close_stream(stream: AsyncIterator[str]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
