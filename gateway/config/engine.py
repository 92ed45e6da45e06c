"""The speech engine's sections (`tts`, `engine`, `gpu`), derived from the engine's own settings.

Their keys, types, defaults and bounds are those of the dataclasses in tts_engine/settings.py, which an
engine worker reads without pydantic; here each becomes a pydantic section with the same fields (so
unknown keys, env overrides and errors naming the key work as for every other section), and the
dataclass's own checks across keys run after pydantic's. What only the gateway reads is added here: the
engine's worker processes (`engine.workers`, `remote`, `worker_*`).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from gateway.config.base import Section
from tts_engine.settings import BOUNDS, EngineSettings, GPUSettings, GpuSimSettings, TTSSettings


class SettingsSection(Section):
    """A section whose fields are an engine settings dataclass's (``settings_type``)."""

    settings_type: ClassVar[Any]  # the dataclass (tts_engine/settings.py)

    def to_settings(self) -> Any:
        """The engine's dataclass of this section (keys of the gateway's own are left out)."""
        return self.settings_type.from_dict(self.model_dump())

    @model_validator(mode="after")
    def _settings_checks(self) -> SettingsSection:
        self.to_settings()  # the dataclass's rules across keys (each key was checked above)
        return self


def settings_section(settings: type, **models: type[SettingsSection]) -> Any:
    """A pydantic section with the fields of the dataclass ``settings`` (its properties too); a nested
    dataclass field becomes the section given for it in ``models``."""
    hints = typing.get_type_hints(settings)
    namespace: dict[str, Any] = {"__module__": __name__, "__annotations__": {}, "settings_type": settings}
    for item in dataclasses.fields(settings):
        if item.name in models:
            namespace["__annotations__"][item.name] = models[item.name]
            namespace[item.name] = Field(default_factory=models[item.name])
        else:
            namespace["__annotations__"][item.name] = hints[item.name]
            default: dict[str, Any] = {"default": item.default}
            if item.default is dataclasses.MISSING:
                default = {"default_factory": item.default_factory}
            namespace[item.name] = Field(**default, **item.metadata.get(BOUNDS, {}))
    namespace |= {name: value for name, value in vars(settings).items() if isinstance(value, property)}
    return type(f"{settings.__name__}Fields", (SettingsSection,), namespace)


# the generated bases (typed Any: a type checker cannot see fields made at import time)
_GpuSimFields: Any = settings_section(GpuSimSettings)


class GpuSimConfig(_GpuSimFields):
    __doc__ = GpuSimSettings.__doc__


_TTSFields: Any = settings_section(TTSSettings, gpu_sim=GpuSimConfig)


class TTSConfig(_TTSFields):
    __doc__ = TTSSettings.__doc__


_GPUFields: Any = settings_section(GPUSettings)


class GPUConfig(_GPUFields):
    __doc__ = GPUSettings.__doc__


_EngineFields: Any = settings_section(EngineSettings)


class EngineConfig(_EngineFields):
    """The shared TTS engine: batching and its memory budget (docs/gpu-sharing.md), and where it runs."""

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
