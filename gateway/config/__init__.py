"""The gateway's configuration: one section per module, `Config` and `load_config` in `loader`.

`from gateway.config import Config, load_config, ConfigError, TTSConfig, ...` is the way in; the
sections live in `server` (device socket, OTA, audio, sessions), `llm` (LLM, tools, segmenter), `asr`,
`engine` (tts, engine, gpu: derived from the engine's own settings in tts_engine/settings.py), `api`,
`store` (where the gateway keeps its data), `transport` (MQTT + UDP), `devices`, `agents`, `vision`, and
the service's `service`, `cache` and `batches`.
"""

from gateway.config.agents import AgentsConfig
from gateway.config.api import OPENAI_VOICE_NAMES, ApiConfig
from gateway.config.asr import ASRConfig, VADConfig
from gateway.config.base import ConfigError
from gateway.config.batches import BatchesConfig
from gateway.config.cache import CacheConfig
from gateway.config.devices import DevicesConfig
from gateway.config.engine import EngineConfig, GPUConfig, GpuSimConfig, TTSConfig
from gateway.config.llm import BUILTIN_TOOL_NAMES, LLMConfig, MCPServerConfig, SegmenterConfig, ToolsConfig
from gateway.config.loader import DEFAULT_CONFIG_PATH, ENV_PREFIX, Config, load_config
from gateway.config.server import AudioConfig, AuthConfig, OtaConfig, ServerConfig, SessionConfig
from gateway.config.service import ServiceConfig
from gateway.config.store import StoreConfig
from gateway.config.transport import MqttConfig, TransportConfig, UdpConfig
from gateway.config.vision import VisionConfig

__all__ = [
    "BUILTIN_TOOL_NAMES", "DEFAULT_CONFIG_PATH", "ENV_PREFIX", "OPENAI_VOICE_NAMES", "ASRConfig", "ApiConfig",
    "AudioConfig", "AuthConfig", "BatchesConfig", "CacheConfig", "Config", "ConfigError", "EngineConfig",
    "GPUConfig", "GpuSimConfig", "LLMConfig", "MCPServerConfig", "OtaConfig", "SegmenterConfig", "ServerConfig",
    "ServiceConfig", "SessionConfig", "StoreConfig", "TTSConfig", "ToolsConfig", "VADConfig", "load_config",
    "MqttConfig", "TransportConfig", "UdpConfig", "AgentsConfig", "DevicesConfig", "VisionConfig",
]  # fmt: skip
