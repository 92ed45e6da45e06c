"""The chat-model clients agents use: one per distinct endpoint, model, key and temperature, shared by every
device of those agents, and closed when no longer wanted.

An agent whose LLM settings are the config's own (the default agent's) uses the gateway's LLM
(``Services.llm``). Other clients are kept in least-recently-used order, at most ``agents.llm_clients``;
past it the least recently used client that no turn is using is closed (a client a turn holds is closed
when that turn lets it go, ``lease``). ``aclose`` closes them all (shutdown). Keys are resolved when a
client is made (``env:NAME`` read then) and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.agents.profile import AgentLLM, resolve_key
from gateway.config import LLMConfig
from gateway.llm.base import ChatLLM
from gateway.llm.echo import EchoLLM
from gateway.llm.openai_chat import OpenAIChatLLM

__all__ = ["LLMPool"]

log = logging.getLogger(__name__)

Key = tuple[str, str, str, str, float | None]  # provider, base URL, model, digest of the key, temperature


@dataclass
class _Client:
    llm: ChatLLM
    leases: int = 0
    evicted: bool = False


class LLMPool:
    def __init__(self, default: ChatLLM, config: LLMConfig, *, max_clients: int = 16) -> None:
        self.default = default
        self.config = config
        self.max_clients = max_clients
        self._default_key = self._key(
            AgentLLM.model_construct(
                provider=config.provider,
                base_url=config.base_url,
                model=config.model,
                api_key="config",
                temperature=None,
            )  # fmt: skip
        )
        self._echo = EchoLLM()
        self._clients: OrderedDict[Key, _Client] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self.created = 0  # clients made so far (tests)

    def __len__(self) -> int:
        return len(self._clients)

    def _key(self, settings: AgentLLM) -> Key:
        key = resolve_key(settings.api_key, self.config.api_key)
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest() if key else ""
        if settings.provider == "echo":
            return ("echo", "", "", "", None)
        return ("openai", settings.base_url.rstrip("/"), settings.model, digest, settings.temperature)

    @contextlib.contextmanager
    def lease(self, settings: AgentLLM) -> Iterator[ChatLLM]:
        """The client for ``settings``, held for a turn (not closed while held)."""
        key = self._key(settings)
        if key == self._default_key:
            yield self.default
            return
        if key[0] == "echo":
            yield self._echo
            return
        client = self._clients.get(key)
        if client is None:
            client = _Client(self._make(settings))
            self._clients[key] = client
            self.created += 1
        self._clients.move_to_end(key)
        client.leases += 1
        self._evict()
        try:
            yield client.llm
        finally:
            client.leases -= 1
            if client.evicted and client.leases == 0:
                self._close(client)

    def _make(self, settings: AgentLLM) -> ChatLLM:
        cfg = self.config
        return OpenAIChatLLM(
            base_url=settings.base_url,
            api_key=resolve_key(settings.api_key, cfg.api_key) or None,
            model=settings.model,
            timeout_s=cfg.timeout_s,
            first_token_timeout_s=cfg.first_token_timeout_s,
            temperature=settings.temperature,
        )

    def _evict(self) -> None:
        """Closes least recently used clients past ``max_clients`` (those in a turn when it ends)."""
        for key in list(self._clients):
            if len(self._clients) <= self.max_clients:
                return
            client = self._clients.pop(key)
            client.evicted = True
            if client.leases == 0:
                self._close(client)

    def _close(self, client: _Client) -> None:
        aclose = getattr(client.llm, "aclose", None)
        if aclose is None:
            return
        task = asyncio.get_running_loop().create_task(aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Closes every client (shutdown); the gateway's own LLM is its owner's to close."""
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            aclose = getattr(client.llm, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=5.0)
