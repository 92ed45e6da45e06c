"""What every session shares: config, the TTS engine, the LLM, ASR, metrics, the store, the device
registry and activation, the agents and their LLM clients, vision, and the service's parts (API keys as
accounts, limits, usage, the audio cache, batch jobs: gateway/service)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.agents.active import Agents
from gateway.agents.llm_pool import LLMPool
from gateway.agents.store import AGENTS_SCHEMA
from gateway.agents.vision import VisionService
from gateway.asr import ASR, create_asr
from gateway.checks.model import (
    CheckResult,
    asr_status_checks,
    loaded_model_checks,
    log_checks,
    tts_file_checks,
)
from gateway.config import DEFAULT_CONFIG_PATH, Config, ConfigError, LLMConfig
from gateway.device.registry import LiveSession, SessionRegistry
from gateway.devices.activation import Activation, ActivationKeys
from gateway.devices.registry import DeviceRegistry
from gateway.devices.tables import DEVICES_SCHEMA
from gateway.llm.base import ChatLLM
from gateway.llm.echo import EchoLLM
from gateway.llm.memory import ConversationMemory
from gateway.llm.memory_store import MEMORY_SCHEMA
from gateway.llm.openai_chat import OpenAIChatLLM
from gateway.metrics import GatewayMetrics
from gateway.service.accounts import KEYS_SCHEMA, Accounts
from gateway.service.batches import BATCHES_SCHEMA, BatchRunner, BatchStore
from gateway.service.cache import AudioCache
from gateway.service.limits import Limiter
from gateway.service.usage import USAGE_SCHEMA, UsageMeter
from gateway.speech.phrases import Phrases
from gateway.speech.turn import TurnConfig, turn_config
from gateway.store import Schema, Store, StoreError, StoreUnavailable
from gateway.tools.base import ToolSource
from gateway.tts_choice import TTSChoice, choose_tts_backend, create_tts_backend, set_cpu_threads
from gateway.voices.store import VoiceStore
from tts_engine import SpeechEngine, TTSEngine
from tts_engine.build import engine_for_backend

if TYPE_CHECKING:
    from gateway.tools.mcp_servers import MCPServerPool

log = logging.getLogger(__name__)

# The tables in the store (gateway/store, docs/store.md): one Schema per feature module that keeps data,
# declared in that module and listed here once; migrated at start-up in this order (a schema whose tables
# reference another's comes after it).
STORE_SCHEMAS: tuple[Schema, ...] = (
    MEMORY_SCHEMA, AGENTS_SCHEMA, DEVICES_SCHEMA, KEYS_SCHEMA, USAGE_SCHEMA, BATCHES_SCHEMA
)


def engine_sections(config: Config) -> dict[str, Any]:
    """The config sections the engine is built from (tts_engine/build.py), as plain dicts."""
    return {name: getattr(config, name).model_dump(mode="json") for name in ("tts", "engine", "gpu")}


def fixed_phrases(
    config: Config, turns: TurnConfig, cache: AudioCache | None = None, voices: VoiceStore | None = None
) -> Phrases:
    """The sentences a device hears again and again, one of them even when no engine can speak, in the
    configured voice: pinned in the audio cache (gateway/speech/phrases.py)."""
    greeting = [config.session.greeting] if config.session.enable_greeting else []
    texts = [*greeting, config.llm.apology, config.llm.tool_filler, config.asr.not_configured_reply]
    return Phrases(texts, output_rate=turns.sample_rate, voice=turns.voice, cache=cache, voices=voices,
                   read_cache=config.cache.devices)  # fmt: skip


def create_llm(cfg: LLMConfig) -> ChatLLM:
    if cfg.provider == "echo":
        return EchoLLM()
    return OpenAIChatLLM(
        base_url=cfg.base_url,
        api_key=cfg.api_key or None,
        model=cfg.model,
        timeout_s=cfg.timeout_s,
        first_token_timeout_s=cfg.first_token_timeout_s,
    )


def _in_process_engine(config: Config, choice: TTSChoice) -> tuple[TTSEngine, list[CheckResult]]:
    """The engine as a thread of this process (``engine.workers: 0``), with its start-up model checks."""
    checks: list[CheckResult] = []
    set_cpu_threads(choice.backend, config.tts.cpu_threads)
    if choice.backend == "cosyvoice":  # cheap (checkpoint indexes only); problems logged with fixes
        checks = tts_file_checks(config.tts, onnx=False, tokenizer=False)
        if any(check.failed for check in checks):
            log_checks(checks)
    backend = create_tts_backend(choice.backend, config.tts, config.engine, config.gpu)
    checks += loaded_model_checks(backend)  # the tokenizer and ONNX sessions it loaded
    # the text normaliser is built here, at start-up: the wetext FSTs load once per process
    return engine_for_backend(backend, engine_sections(config)), checks


@dataclass
class Services:
    config: Config
    engine: SpeechEngine  # TTSEngine in process, or EngineClient: the engine in worker processes
    llm: ChatLLM
    asr: ASR
    metrics: GatewayMetrics
    tts_warning: str | None = None
    voices: VoiceStore | None = None  # the voice presets (registered with engines that clone voices)
    checks: list[CheckResult] = field(default_factory=list)  # start-up model checks (gateway/checks/model.py)
    # the live device sessions, read-only here: the device socket (gateway/device/socket.py) writes it
    sessions: SessionRegistry[LiveSession] = field(default_factory=SessionRegistry)
    # the gateway's persistent data (store.url: SQLite by default, PostgreSQL to share it between gateways);
    # opened in start(), closed last
    store: Store | None = None
    memory: ConversationMemory | None = None  # per-device conversation memory, in the store (agents' memory)
    devices: DeviceRegistry | None = None  # every device that called OTA or connected (gateway/devices)
    activation: Activation | None = None  # activation by code (ota.activation: code)
    agents: Agents | None = None  # the agents, and which one each device talks with (gateway/agents)
    llms: LLMPool | None = None  # the agents' LLM clients
    vision: VisionService | None = None  # the camera's explain endpoint (gateway/api/vision.py)
    # process-wide tool sources (server-side MCP servers, gateway/tools/mcp_servers.py), offered in
    # every query turn after the device's tools; read at each turn, so sources added later count
    tool_sources: list[ToolSource] = field(default_factory=list)
    mcp_servers: MCPServerPool | None = None  # tools.mcp_servers, started in start(), shared by all sessions
    # the apology, tool filler and not-configured notice as audio, made at start-up (gateway/speech/phrases.py)
    phrases: Phrases | None = None
    # what every device turn reads of the config (the downlink's output rate, the voice, Opus, pacing)
    turns: TurnConfig = field(default_factory=TurnConfig)
    # the service (gateway/service, docs/service.md): keys as accounts, their limits, usage per key and day,
    # the exact audio cache, batch jobs in the store and their runner
    accounts: Accounts = field(default_factory=lambda: Accounts(()))
    limiter: Limiter = field(default_factory=Limiter)
    usage: UsageMeter = field(default_factory=lambda: UsageMeter(None))
    cache: AudioCache | None = None
    batches: BatchStore | None = None
    batch_runner: BatchRunner | None = None
    _closing: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def build(
        cls,
        config: Config,
        *,
        engine: SpeechEngine | None = None,
        llm: ChatLLM | None = None,
        asr: ASR | None = None,
    ) -> Services:
        warning = None
        checks: list[CheckResult] = []
        if engine is None and config.engine.remote:  # workers started elsewhere pick their own backend
            from gateway.engine_client.build import build_engine_client

            engine = build_engine_client(config, config.tts.backend)
        if engine is None:
            choice = choose_tts_backend(config.tts)
            warning = choice.warning
            if warning:
                log.warning("!!! %s", warning)
            if config.engine.workers != 0:  # the engine in worker processes started here
                from gateway.engine_client.build import build_engine_client

                engine = build_engine_client(config, choice.backend)
            else:
                engine, checks = _in_process_engine(config, choice)
        turns = turn_config(config)
        cache = AudioCache(config.cache, root=DEFAULT_CONFIG_PATH.parent)
        voices = VoiceStore(config.tts.voices_dir)
        services = cls(
            config=config,
            turns=turns,
            engine=engine,
            llm=llm or create_llm(config.llm),
            asr=asr or create_asr(config.asr, config.gpu),
            metrics=GatewayMetrics(max_key_labels=config.service.metrics_max_keys),
            tts_warning=warning,
            voices=voices,
            phrases=fixed_phrases(config, turns, cache, voices),
            cache=cache,
        )
        try:
            services.store = Store.from_config(config.store, STORE_SCHEMAS)
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
        services.build_service()
        # memory is on per agent (the default agent's from session.memory), so it is always at hand
        services.memory = ConversationMemory.open(config.session, services.llm, services.store)
        services.devices = DeviceRegistry(services.store, config.devices)
        services.activation = Activation(
            config.devices, services.devices, ActivationKeys.load(config.devices.activation_keys_file)
        )
        services.agents = Agents(config, services.store, services.devices)
        services.llms = LLMPool(services.llm, config.llm, max_clients=config.agents.llm_clients)
        services.vision = VisionService(config)
        if checks:
            services.checks = checks + asr_status_checks(services.asr)
            log_checks(services.checks)
        services.metrics.watch_engine(lambda: services.engine.stats)
        services.metrics.watch_cache(cache.stats)
        return services

    def build_service(self) -> None:
        """Keys, limits, usage and batch jobs on the store (docs/service.md)."""
        service, config = self.config.service, self.config
        self.accounts = Accounts(config.api.api_keys, store=self.store, require_keys=service.require_keys,
                                 refresh_s=service.key_refresh_s, cache_size=service.key_cache_size)  # fmt: skip
        self.usage = UsageMeter(self.store, flush_s=service.usage_flush_s, refresh_s=service.key_refresh_s)
        self.limiter = Limiter(used=self.usage.used)
        if config.batches.enabled and self.store is not None:
            self.batches = BatchStore(self.store)
            folder = Path(config.batches.dir)
            self.batch_runner = BatchRunner(
                self.batches, self.engine, config.batches,
                folder if folder.is_absolute() else DEFAULT_CONFIG_PATH.parent / folder,
                cache=self.cache, voices_of=lambda: self.voices, meter=self.usage,
                on_outcome=lambda outcome: self.metrics.batch_items.labels(outcome).inc(),
            )  # fmt: skip

    async def start(self) -> None:
        await self.open_store()
        await self.usage.start()
        await self.engine.start()
        if self.cache is not None:  # the model's revision is part of every key: after the engine started
            await self.cache.start(self.engine, Path(self.config.tts.model_dir))
        await self.register_voices()
        if self.phrases is not None:  # before the first device: the apology must not need the engine
            await self.phrases.start(self.engine)
        await self.accounts.refresh()  # whether keys in the store make keys needed
        if self.batch_runner is not None:
            await self.batch_runner.start()  # unfinished jobs resume
        await self.start_mcp_servers()

    async def open_store(self) -> None:
        """Opens the store and migrates its schemas (bounded). A database that is down now does not stop the
        gateway: devices talk without memory until it is back (logged, and in /v1/health). A store this
        gateway cannot use at all (a folder it cannot make, a refused password, a newer schema) stops it."""
        if self.store is None:
            return
        try:
            await self.store.open()
        except StoreUnavailable as exc:
            log.error("!!! %s; the gateway starts without it and retries on use", exc)
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
        else:
            log.info("store: %s", self.store.safe_url)
        if self.memory is not None and self.config.session.memory == "local":
            await self.memory.start()  # imports the memory file of earlier gateways, once
        if self.devices is not None:
            self.devices.on_kick = self.kick
            self.devices.start()  # the heartbeat of this gateway's devices

    def kick(self, device_id: str) -> bool:
        """Closes the device's session on this gateway, if it has one here (from its own task)."""
        session = self.sessions.get(device_id)
        if session is None:
            return False
        task = asyncio.get_running_loop().create_task(session.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return True

    async def start_mcp_servers(self) -> None:
        """The configured server-side MCP servers, as tool sources of every session (bounded wait)."""
        tools = self.config.tools
        if not (tools.enabled and tools.mcp_servers) or self.mcp_servers is not None:
            return
        from gateway.tools.mcp_servers import MCPServerPool  # the SDK loads only when servers are configured

        self.mcp_servers = MCPServerPool.from_config(tools)
        self.tool_sources.extend(self.mcp_servers.sources)
        await self.mcp_servers.start()

    async def register_voices(self) -> None:
        """Load the voice presets and prepare each in the engine (backends that clone voices only)."""
        if self.voices is None or not self.engine.supports_cloning:
            return
        for preset in self.voices.load():
            try:
                await self.engine.add_voice(preset)
            except Exception as exc:  # a preset the backend cannot use is skipped; the server starts
                log.warning("voice %r is not available: %s", preset.name, exc)
        if self.config.tts.voice not in self.engine.voices:
            log.warning(
                "!!! the configured voice %r is not available (voices: %s); add %s/%s.yaml",
                self.config.tts.voice,
                ", ".join(self.engine.voices) or "none",
                self.config.tts.voices_dir,
                self.config.tts.voice,
            )

    async def close(self) -> None:
        await self.sessions.close_all()
        if self.batch_runner is not None:
            await self.batch_runner.aclose()  # its items go back to the store (bounded)
        if self.phrases is not None:
            await self.phrases.aclose()
        await self.engine.close()
        if self.cache is not None:
            await self.cache.aclose()  # queued disk writes land first (bounded)
        if self.mcp_servers is not None:
            await self.mcp_servers.aclose()  # stops their processes (bounded)
        if self.memory is not None:
            await self.memory.aclose()  # pending writes land first (bounded)
        if self.devices is not None:
            await self.devices.aclose()  # its heartbeat stops, pending writes land (bounded)
        if self.agents is not None:
            await self.agents.aclose()
        if self.llms is not None:
            await self.llms.aclose()  # the agents' own LLM clients
        await self.usage.aclose()  # what was metered and not written yet (bounded)
        if self.store is not None:
            await self.store.close()  # after everything that writes to it (bounded)
        aclose = getattr(self.llm, "aclose", None)
        if aclose is not None:
            await aclose()
        await self.asr.aclose()

    def _asr_warning(self) -> str | None:
        warning = getattr(self.asr, "warning", None)
        if warning is None and self.asr.name == "none":
            return "speech recognition is not configured (asr.backend: none); typed text still works"
        return warning

    def health(self) -> dict[str, Any]:
        engine = self.engine.health()
        status, reasons = health_status(self, engine)
        return {
            "status": status,
            "reasons": reasons,
            "sessions": len(self.sessions),
            "tts": {**engine, "warning": self.tts_warning},
            "llm": {"provider": self.config.llm.provider},
            "asr": {"backend": self.asr.name, "warning": self._asr_warning()},
            "audio": {"output_sample_rate": self.turns.sample_rate},
            "checks": [check.as_dict() for check in self.checks],
            "mcp_servers": self.mcp_servers.status() if self.mcp_servers is not None else [],
            "phrases": self.phrases.status() if self.phrases is not None else None,
            "store": self.store.status() if self.store is not None else None,
            "cache": self.cache.stats() if self.cache is not None else None,
            "batches": {"running_items": self.batch_runner.running} if self.batch_runner is not None else None,
        }


def health_status(services: Services, engine: dict[str, Any]) -> tuple[str, list[str]]:
    """``ok``, ``degraded`` (serving, with something to fix) or ``unavailable`` (cannot speak now), and why.

    unavailable: no engine worker is ready (all restarting, stalled or failed), or the in-process
    engine crashed or closed. degraded: TTS fell back to espeak-ng, a start-up model check failed, some
    (not all) workers are not ready, the fixed phrases could not be prepared, or the store is unavailable
    (devices talk without memory).
    """
    state = engine.get("state")
    if state in ("unavailable", "crashed", "closed"):
        reason = engine.get("unavailable_reason") or f"the TTS engine is {state}"
        return "unavailable", [str(reason)]
    reasons = []
    if services.tts_warning:
        reasons.append(services.tts_warning)
    reasons += [f"check {check.name}: {check.detail}" for check in services.checks if check.failed]
    not_ready = [w for w in engine.get("workers") or [] if w.get("state") != "ready"]
    for worker in not_ready:
        why = worker.get("stalled") or worker.get("last_error")
        reasons.append(
            f"engine worker {worker.get('address')} is {worker.get('state')}" + (f": {why}" if why else "")
        )
    store = services.store.status() if services.store is not None else None
    if store is not None and store["state"] == "unavailable":
        reasons.append(f"the store ({store['url']}) is unavailable: {store['error']}")
    return ("degraded" if reasons else "ok"), reasons
