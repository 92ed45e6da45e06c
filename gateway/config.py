"""Configuration: `config.yaml` defaults, an optional other file, env overrides.

Environment variables `XZ_<SECTION>__<KEY>` (nested keys joined by `__`)
override single values; they are parsed as YAML scalars, so `true` and `24000`
mean what they look like, except for string keys, which take the value as written
(`XZ_LLM__API_KEY=0123` is the string "0123"). Validation errors stop the process
with the key's dotted name in the message.

Every list-of-strings key (`server.auth.tokens`, `api.api_keys`, ...) follows one rule, wherever
the value comes from: a list, or one string of comma-separated entries (`XZ_API__API_KEYS=k1,k2`,
`XZ_SERVER__AUTH__TOKENS=tok-abc`). Entries are stripped and empty ones dropped. From the
environment, a value that starts with `[` is a YAML/JSON list (`["a,b", c]` for an entry that holds
a comma); anything else is taken as written, never as a YAML number or boolean.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent.parent / "config.yaml"
ENV_PREFIX = "XZ_"


class ConfigError(Exception):
    """The configuration is unreadable or invalid."""


def _is_text_list(annotation: Any) -> bool:
    return get_origin(annotation) is list and get_args(annotation) == (str,)


def _is_text(annotation: Any) -> bool:
    """A plain string key (`str` or `str | None`), whose environment value is never parsed as YAML."""
    if annotation is str:
        return True
    args = get_args(annotation)
    return bool(args) and str in args and all(a in (str, type(None)) for a in args)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _text_list(cls, value: Any, info: ValidationInfo) -> Any:
        """A list-of-strings key takes a list or one comma-separated string; empty entries are dropped."""
        field = cls.model_fields.get(info.field_name or "")
        if field is None or not _is_text_list(field.annotation):
            return value
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list):
            return value
        items = [str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in value]
        items = [v.strip() if isinstance(v, str) else v for v in items]
        return [v for v in items if v is not None and v != ""]


class AuthConfig(_Section):
    """Device socket admission (docs/device-auth.md)."""

    enabled: bool = False
    tokens: list[str] = Field(default_factory=list)  # operator tokens: never sent by OTA
    allowed_devices: list[str] = Field(default_factory=list)
    ota_open: bool = False  # OTA issues a device token to any Device-Id that asks
    secret: str = Field("", repr=False)  # signs device tokens; else secret_file; else random per process
    secret_file: str = ""  # read, or created with a random key, when `secret` is empty
    device_token_ttl_s: float = Field(30 * 86400, ge=60, le=366 * 86400)

    @field_validator("allowed_devices")
    @classmethod
    def _normalized_ids(cls, v: list[str]) -> list[str]:
        """MACs in the form devices are matched in (lower case, colons), whatever case they are listed in."""
        from gateway.xiaozhi.handshake import normalize_device_id

        return [normalize_device_id(item) or item for item in v]

    @field_validator("secret")
    @classmethod
    def _secret_length(cls, v: str) -> str:
        if v and len(v) < 16:
            raise ValueError("must be empty or at least 16 characters")
        return v


class ServerConfig(_Section):
    host: str = "0.0.0.0"
    port: int = Field(8000, ge=0, le=65535)
    public_ws_url: str = ""
    # OTA derives the URL from X-Forwarded-Host/-Proto (set by a reverse proxy) instead of Host/scheme.
    trust_forwarded_headers: bool = False
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    auth: AuthConfig = Field(default_factory=AuthConfig)


class OtaConfig(_Section):
    timezone_offset_minutes: int = Field(480, ge=-720, le=840)
    websocket_version: Literal[1, 2, 3] = 1


class AudioConfig(_Section):
    output_sample_rate: Literal[16000, 24000] = 16000
    frame_ms: Literal[60] = 60
    opus_bitrate: int = Field(24000, ge=6000, le=128000)
    opus_complexity: int = Field(5, ge=0, le=10)
    prebuffer_frames: int = Field(5, ge=1, le=30)
    start_gap_ms: int = Field(120, ge=0, le=2000)
    stop_margin_ms: int = Field(420, ge=0, le=5000)
    max_utterance_s: float = Field(60, gt=0, le=600)


class SessionConfig(_Section):
    idle_no_voice_s: float = Field(120, gt=0)
    idle_hard_s: float = Field(180, gt=0)
    wake_words: list[str] = Field(default_factory=list)
    enable_greeting: bool = True
    greeting: str = "你好，我在呢。"
    exit_commands: list[str] = Field(default_factory=list)
    max_text_frame_bytes: int = Field(65536, ge=256)
    max_binary_frame_bytes: int = Field(65551, ge=256)
    mcp_timeout_s: float = Field(30, gt=0, le=300)
    vision_url: str = Field("", max_length=2048)
    # per-device conversation memory (gateway/llm/memory.py): none, or local (a SQLite file)
    memory: Literal["none", "local"] = "none"
    memory_path: str = "data/memory.sqlite3"  # relative paths: from the project root
    memory_max_messages: int = Field(40, ge=4, le=10000)
    memory_summary_timeout_s: float = Field(20, gt=0, le=300)
    memory_summary_max_chars: int = Field(1000, ge=50, le=20000)


class LLMConfig(_Section):
    provider: Literal["echo", "openai"] = "echo"
    base_url: str = "https://api.openai.com/v1"
    api_key: str = ""
    model: str = "gpt-4o-mini"
    system_prompt: str = ""
    timeout_s: float = Field(30, gt=0)
    first_token_timeout_s: float = Field(15, gt=0)
    max_history_turns: int = Field(20, ge=0)
    apology: str = "抱歉，我现在有点问题，请稍后再试。"
    # function calling (provider openai, `tools` section): per call, rounds of calls per turn,
    # and the filler spoken when a round's calls take longer than tool_filler_after_s
    tool_timeout_s: float = Field(10, gt=0, le=300)
    max_tool_rounds: int = Field(3, ge=1, le=10)
    tool_filler_after_s: float = Field(1.5, ge=0, le=60)
    tool_filler: str = Field("稍等，我查一下。", max_length=200)


class MCPServerConfig(_Section):
    """One server-side MCP server (docs/tools.md): a `command` run over stdio, or a streamable HTTP `url`."""

    command: str = ""  # stdio: the program to run, with args, extra env vars, working directory
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = ""
    url: str = ""  # streamable HTTP: the endpoint (http(s)://host/mcp), with extra request headers
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    enabled: bool = True
    call_timeout_s: float = Field(30, gt=0, le=600)  # one tools/call (and tools/list)

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("set exactly one of command (stdio) or url (streamable HTTP)")
        if self.url and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for a command; a url server takes headers")
        if self.command and self.headers:
            raise ValueError("headers are for a url server")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return self


BUILTIN_TOOL_NAMES = ("end_conversation", "change_voice", "get_time")  # gateway/tools/builtins.py


class ToolsConfig(_Section):
    """Tools the LLM may call (docs/tools.md)."""

    enabled: bool = True  # offer tools to the LLM at all (provider openai)
    # the gateway's own tools (gateway/tools/builtins.py) offered in every session
    builtins: list[str] = Field(default_factory=lambda: list(BUILTIN_TOOL_NAMES))  # unknown: logged, ignored
    max_tools: int = Field(64, ge=1, le=128)  # offered per turn (OpenAI allows 128)
    max_argument_chars: int = Field(8192, ge=64, le=1_000_000)
    max_result_chars: int = Field(4000, ge=64, le=1_000_000)  # longer results are cut for the LLM

    # Server-side MCP servers by name, started once per process and shared by every session.
    mcp_servers: dict[str, MCPServerConfig] = Field(default_factory=dict)
    # How long start-up waits for the MCP servers to list their tools (the server starts anyway).
    mcp_start_timeout_s: float = Field(10, ge=0, le=600)


class SegmenterConfig(_Section):
    first_segment_at_comma: bool = True
    max_chars: int = Field(120, ge=8, le=1000)


class GpuSimConfig(_Section):
    """The gpu-sim benchmark backend (tts_engine/backends/gpu_sim.py): each batched step holds the GIL
    for python_ms (kernel launches) then waits step_ms with it released (the GPU computing)."""

    step_ms: float = Field(20, ge=0, le=10000)
    python_ms: float = Field(5, ge=0, le=10000)
    chunk_ms: int = Field(40, ge=1, le=2000)  # audio per stream per step
    hop_chunks: int = Field(5, ge=1, le=1000)  # steps whose audio leaves as one chunk
    max_batch_size: int = Field(128, ge=1, le=1024)


class TTSConfig(_Section):
    backend: Literal["auto", "espeak", "fake", "gpu-sim", "cosyvoice"] = "auto"
    voice: str = "default"
    model_dir: str = "models/Fun-CosyVoice3-0.5B"
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    voices_dir: str = "voices"
    max_pending_requests: int = Field(256, ge=1)
    max_buffered_chunks: int = Field(8, ge=1)
    cpu_threads: int = Field(0, ge=0, le=256)
    # numbers, dates, units... read out before the backend gets the text (cosyvoice/text_normalization.py)
    text_normalization: Literal["wetext", "basic", "off"] = "wetext"
    gpu_sim: GpuSimConfig = Field(default_factory=GpuSimConfig)


class VADConfig(_Section):
    """Silero VAD endpointing (auto and realtime modes, barge-in)."""

    threshold: float = Field(0.5, gt=0, lt=1)
    threshold_low: float = Field(0.3, gt=0, lt=1)
    min_speech_ms: int = Field(160, ge=0, le=5000)
    min_silence_ms: int = Field(400, ge=32, le=10000)
    pre_roll_ms: int = Field(300, ge=0, le=2000)
    detect_mute_s: float = Field(2.0, ge=0, le=30)

    @model_validator(mode="after")
    def _hysteresis(self) -> VADConfig:
        if self.threshold_low > self.threshold:
            raise ValueError("threshold_low must be <= threshold")
        return self


class ASRConfig(_Section):
    backend: Literal["auto", "funasr", "none"] = "auto"
    model: str = "auto"  # models/SenseVoiceSmall when present, else iic/SenseVoiceSmall
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    language: Literal["auto", "zh", "en", "yue", "ja", "ko"] = "auto"
    use_itn: bool = True
    download: bool = True
    load_timeout_s: float = Field(900, gt=0)
    on_load_failure: Literal["error", "not_configured"] = "error"
    threads: int = Field(1, ge=0, le=256)
    max_batch: int = Field(8, ge=1, le=256)
    max_batch_audio_s: float = Field(120, gt=0)
    max_queue: int = Field(64, ge=1)
    min_utterance_s: float = Field(0.5, ge=0, le=10)
    # Server-side echo cancellation of the uplink against our own reply (gateway/aec). `auto`: for
    # devices whose hello says features.aec (firmware built with CONFIG_USE_SERVER_AEC: the device
    # leaves echo cancellation to the server). With it on, realtime mode barges in on speech onset.
    aec: Literal["auto", "on", "off"] = "auto"
    # A linear canceller (SpeexDSP) beside AEC3 whose echo estimate detects the user talking over the
    # reply and passes them unsuppressed: barge-in found sooner (gateway/aec/stages.py); off: AEC3 alone
    aec_double_talk: bool = True
    not_configured_reply: str = "语音识别还没有配置，请直接输入文字。"
    vad: VADConfig = Field(default_factory=VADConfig)


class GPUConfig(_Section):
    """One GPU memory plan per process, split between the TTS engine and ASR."""

    memory_gib: float = Field(0, ge=0)
    asr_memory_gib: float = Field(2.0, ge=0)

    @model_validator(mode="after")
    def _split(self) -> GPUConfig:
        if self.memory_gib and self.asr_memory_gib >= self.memory_gib:
            raise ValueError("asr_memory_gib must be smaller than memory_gib")
        return self

    @property
    def tts_memory_gib(self) -> float | None:
        """The TTS engine's share (None: no cap)."""
        return self.memory_gib - self.asr_memory_gib if self.memory_gib else None



class EngineConfig(_Section):
    """The shared TTS engine: batching and its memory budget (docs/gpu-sharing.md)."""

    # GiB (> 1) or a fraction of the device (0 < x <= 1); None: gpu's TTS share, else 6 GiB.
    gpu_memory_gib: float | None = Field(None, gt=0)
    max_queue_wait_s: float = Field(30, gt=0)  # a request waiting longer for capacity fails
    max_batch_size: int = Field(64, ge=1, le=256)  # KV slots at most (the budget may allow fewer)
    max_llm_len: int = Field(4096, ge=64, le=65536)  # KV positions per slot
    llm_backend: Literal["native", "vllm"] = "native"  # vllm: pip install .[vllm], needs CUDA
    # flow + vocoder rows per step; more ready hops wait a step, least playback slack served first
    max_hop_rows: int = Field(16, ge=1, le=256)
    # new LLM segments prefilled per step (None: all that are waiting); the rest a step later, in slack order
    max_prefill_rows: int | None = Field(None, ge=1, le=256)
    torch_compile: bool = False  # DiT step + vocoder through torch.compile (inductor); unmeasured on GPU
    cuda_graphs: bool = False  # decode step as CUDA graphs (CUDA + native LLM only); unmeasured, so off
    # Flow chunk caches (per-voice prompt prefix, per-stream chunks): exact, only new frames computed.
    flow_cache: bool = True
    flow_cache_mib: float | None = Field(None, ge=0)  # None: what the memory plan leaves over
    flow_cache_warm: bool = True  # a voice's prompt chunks are computed when it is added, not at first use
    final_pass: Literal["exact", "streaming"] = "exact"  # streaming: the closing flow call keeps the chunk mask
    # Engine worker processes (docs/engine-workers.md). 0: the engine runs in the gateway process;
    # auto: one per visible CUDA GPU (one on CPU), times workers_per_device (several under CUDA MPS).
    workers: Literal["auto"] | Annotated[int, Field(ge=0, le=64)] = "auto"
    workers_per_device: int = Field(1, ge=1, le=16)
    remote: list[str] = Field(default_factory=list)  # tcp://host:port workers started elsewhere
    # the token those workers were started with (--token-file / XZ_ENGINE_TOKEN); "": they check none
    remote_token: str = Field("", max_length=4096, repr=False)
    worker_start_timeout_s: float = Field(300, gt=0)  # process start to READY (model load)
    worker_connect_timeout_s: float = Field(10, gt=0)  # socket connect + hello
    # failed restarts in a row after which a worker shows as `failed` (it is still retried, at the cap)
    worker_max_restarts: int = Field(10, ge=0, le=1000)
    # a worker that answers no ping, or whose engine step runs, this long is stalled: not ready, its
    # requests fail (apology / 503); still stuck 3x as long and it is killed and restarted
    worker_stall_timeout_s: float = Field(5.0, gt=0, le=600)
    # constructor keywords for the worker's backend (fake, gpu-sim, espeak; tests and benchmarks)
    worker_backend_options: dict[str, Any] = Field(default_factory=dict)


OPENAI_VOICE_NAMES = (
    "alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer",
    "verse",
)  # fmt: skip


class ApiConfig(_Section):
    """The HTTP/WebSocket TTS API (gateway/api)."""

    max_text_chars: int = Field(4096, ge=1, le=1_000_000)
    max_prompt_seconds: float = Field(30, ge=1, le=30)  # the voice store takes 1..30 s prompts
    max_prompt_bytes: int = Field(10 * 1024 * 1024, ge=1024, le=16 * 1024 * 1024)
    api_keys: list[str] = Field(default_factory=list)
    # With api_keys set, /metrics and the OpenAPI docs (/docs, /redoc, /openapi.json) need a key too,
    # unless made public on purpose here (gateway/security/http_guard.py).
    public_metrics: bool = False
    public_docs: bool = False
    # OTA request bodies (the device's JSON report; a few KiB): cap in bytes, 413 beyond it.
    max_ota_body_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    default_sample_rate: Literal[8000, 12000, 16000, 22050, 24000, 44100, 48000] = 24000
    voice_aliases: dict[str, str] = Field(default_factory=lambda: dict.fromkeys(OPENAI_VOICE_NAMES, ""))
    # An unknown voice on the HTTP speech endpoints: fallback (the default voice, logged once per
    # name; what the incumbent's providers and OpenAI clients need) or strict (400 unknown_voice).
    unknown_voice: Literal["fallback", "strict"] = "fallback"


class Config(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    ota: OtaConfig = Field(default_factory=OtaConfig)
    audio: AudioConfig = Field(default_factory=AudioConfig)
    session: SessionConfig = Field(default_factory=SessionConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    segmenter: SegmenterConfig = Field(default_factory=SegmenterConfig)
    tts: TTSConfig = Field(default_factory=TTSConfig)
    asr: ASRConfig = Field(default_factory=ASRConfig)
    gpu: GPUConfig = Field(default_factory=GPUConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)

    @field_validator("session")
    @classmethod
    def _idle_order(cls, v: SessionConfig) -> SessionConfig:
        if v.idle_hard_s < v.idle_no_voice_s:
            raise ValueError("idle_hard_s must be >= idle_no_voice_s")
        return v

    @model_validator(mode="after")
    def _engine_within_gpu_plan(self) -> Config:
        share, budget = self.gpu.tts_memory_gib, self.engine.gpu_memory_gib
        if share is not None and budget is not None and budget > 1 and budget > share:
            raise ValueError(
                f"engine.gpu_memory_gib ({budget}) exceeds the TTS share of the GPU plan "
                f"(gpu.memory_gib - gpu.asr_memory_gib = {share})"
            )
        return self


def _deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            continue
        value = _env_value(name, raw, path)
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {name} conflicts with another override")
        node[path[-1]] = value
    return tree


def _env_value(name: str, raw: str, path: list[str]) -> Any:
    if _is_text_list(_field_annotation(path)):
        if not raw.lstrip().startswith("["):
            return raw  # comma-separated entries, split by _Section._text_list
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = " ".join(str(exc).split())
            raise ConfigError(f"environment variable {name} is not a valid list: {problem}") from None
    if _is_text(_field_annotation(path)):
        return raw  # a string key takes the value as written: `XZ_LLM__API_KEY=0123` stays "0123"
    try:
        return yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        return raw


def _field_annotation(path: list[str]) -> Any:
    """The type of the config key at ``path`` (None when there is no such key)."""
    node: Any = Config
    for part in path:
        if not (isinstance(node, type) and issubclass(node, BaseModel)) or part not in node.model_fields:
            return None
        node = node.model_fields[part].annotation
    return node


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults <- `config.yaml` (or `path`) <- env <- explicit overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    elif DEFAULT_CONFIG_PATH.exists():
        data = _read_yaml(DEFAULT_CONFIG_PATH)
    data = _deep_merge(data, _env_overrides(os.environ if environ is None else environ))
    if overrides:
        data = _deep_merge(data, overrides)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            problems.append(f"{key}: {err['msg']}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
