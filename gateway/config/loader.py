"""Configuration: `config.yaml` defaults, an optional other file, env overrides.

Environment variables `XZ_<SECTION>__<KEY>` (nested keys joined by `__`)
override single values; they are parsed as YAML scalars, so `true` and `24000`
mean what they look like, except for string keys, which take the value as written
(`XZ_LLM__API_KEY=0123` is the string "0123"). Validation errors stop the process
with the key's dotted name in the message.

List-of-strings keys follow one rule (gateway/config/base.py). From the environment, a value that
starts with `[` is a YAML/JSON list (`["a,b", c]` for an entry that holds a comma); anything else is
taken as written, never as a YAML number or boolean.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from gateway.config.agents import AgentsConfig
from gateway.config.api import ApiConfig
from gateway.config.asr import ASRConfig
from gateway.config.base import ConfigError, Section, is_text, is_text_list
from gateway.config.batches import BatchesConfig
from gateway.config.cache import CacheConfig
from gateway.config.devices import DevicesConfig
from gateway.config.engine import EngineConfig, GPUConfig, TTSConfig
from gateway.config.llm import LLMConfig, SegmenterConfig, ToolsConfig
from gateway.config.server import AudioConfig, OtaConfig, ServerConfig, SessionConfig
from gateway.config.service import ServiceConfig
from gateway.config.store import StoreConfig
from gateway.config.transport import TransportConfig
from gateway.config.vision import VisionConfig
from tts_engine.settings import Settings

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "config.yaml"
ENV_PREFIX = "XZ_"


class Config(Section):
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
    store: StoreConfig = Field(default_factory=StoreConfig)
    transport: TransportConfig = Field(default_factory=TransportConfig)  # MQTT + UDP (docs/mqtt-udp.md)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    agents: AgentsConfig = Field(default_factory=AgentsConfig)
    vision: VisionConfig = Field(default_factory=VisionConfig)
    service: ServiceConfig = Field(default_factory=ServiceConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    batches: BatchesConfig = Field(default_factory=BatchesConfig)

    @field_validator("session")
    @classmethod
    def _idle_order(cls, v: SessionConfig) -> SessionConfig:
        if v.idle_hard_s < v.idle_no_voice_s:
            raise ValueError("idle_hard_s must be >= idle_no_voice_s")
        return v

    @model_validator(mode="after")
    def _engine_within_gpu_plan(self) -> Config:
        """The engine's rules across its sections (tts_engine/settings.py), as a worker checks them."""
        Settings(tts=self.tts.to_settings(), engine=self.engine.to_settings(), gpu=self.gpu.to_settings())
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
    if is_text_list(_field_annotation(path)):
        if not raw.lstrip().startswith("["):
            return raw  # comma-separated entries, split by Section._text_list
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = " ".join(str(exc).split())
            raise ConfigError(f"environment variable {name} is not a valid list: {problem}") from None
    if is_text(_field_annotation(path)):
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
