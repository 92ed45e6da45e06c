"""The engine worker protocol's frames, one typed struct each (docs/engine-workers.md lists them,
written from here by ``markdown_tables()``; ``python -m tts_engine.worker.frames`` prints them).

Each struct is a frozen dataclass registered under its wire type ``"t"``; tts_engine/worker/codec.py
encodes and checks them. ``EngineInfo`` (tts_engine/interface.py) and ``Report`` are flattened into
``hello``, which keeps the wire format of version 1.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from tts_engine.interface import EngineInfo
from tts_engine.worker.codec import FLAT, Frame, FrameError, UnknownFrame, decode, encode, frame

__all__ = ["FrameError", "UnknownFrame", "decode", "encode"]  # with the structs below


# -- the structs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """A worker's load, steps and memory: sent with hello, every end and result, and on its own."""

    state: str = "running"
    capacity: int = 1
    in_flight: int = 0
    free: int = 0
    queue_depth: int = 0
    connections: int = 0
    pid: int = 0
    device: str = ""
    steps_total: int = 0
    step_running_s: float = 0.0  # how long the engine's current step has run (0 between steps)
    memory: dict[str, float] = field(default_factory=dict)  # the engine's memory plan and use
    connections_total: int = 0
    protocol_errors: int = 0
    outbox_full_waits: int = 0
    auth_failures: int = 0


# client -> worker


@frame("auth")
@dataclass(frozen=True, slots=True, kw_only=True)
class Auth(Frame):
    """The first frame to a worker with a token."""

    token: str


@frame("synth")
@dataclass(frozen=True, slots=True, kw_only=True)
class Synth(Frame):
    """A request: ``voice``, or a zero-shot prompt (``prompt_wav`` WAV bytes + ``prompt_text``); ``priority``
    device, interactive (also when absent) or batch."""

    id: str
    text: str
    rate: int  # the output rate
    voice: str | None = None
    speed: float = 1.0
    instruct: str | None = None
    ahead: float = 0.0  # the listener's playback credit in seconds, as of now
    prompt_wav: bytes | None = None
    prompt_text: str = ""
    priority: str = "interactive"  # the engine's class (tts_engine/interface.py PRIORITIES)


@frame("credit")
@dataclass(frozen=True, slots=True, kw_only=True)
class Credit(Frame):
    """``n`` chunks (``samples`` in all) of request ``id`` were consumed by the reader."""

    id: str
    n: int
    samples: int


@frame("ahead")
@dataclass(frozen=True, slots=True, kw_only=True)
class Ahead(Frame):
    """The listener's playback credit in seconds, as of now."""

    id: str
    s: float


@frame("abort")
@dataclass(frozen=True, slots=True, kw_only=True)
class Abort(Frame):
    """The worker forgets the request; no ``end`` follows."""

    id: str


@frame("voice_add")
@dataclass(frozen=True, slots=True, kw_only=True)
class VoiceAdd(Frame):
    """A call: prepare a voice from its recording (WAV bytes, or nil for a backend's own) and offer it."""

    call: int
    name: str
    prompt_wav: bytes | None = None
    prompt_text: str = ""
    instruct: str | None = None
    description: str = ""


@frame("voice_remove")
@dataclass(frozen=True, slots=True, kw_only=True)
class VoiceRemove(Frame):
    """A call: stop offering a voice added at run time."""

    call: int
    name: str


@frame("health")
@dataclass(frozen=True, slots=True, kw_only=True)
class Health(Frame):
    """A call answered with a ``result`` carrying the report (the gateway's ping)."""

    call: int


# worker -> client


@frame("hello")
@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Frame):
    """Sent first (after a token's check): what the engine is, its voices and its load."""

    version: int
    info: EngineInfo = field(metadata=FLAT)
    voices: list[str]
    default_voice: str
    report: Report = field(metadata=FLAT)


@frame("chunk")
@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk(Frame):
    """int16 little-endian mono PCM at the request's output rate."""

    id: str
    pcm: bytes


@frame("end")
@dataclass(frozen=True, slots=True, kw_only=True)
class End(Frame):
    """The request's last chunk went out; ``in_flight``: the worker's count after it."""

    id: str
    in_flight: int  # the worker's count after this request
    report: Report | None = None


@frame("error")
@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Frame):
    """A typed error (``kind``) for a request (``id``), a call (``call``) or the connection."""

    kind: str
    message: str
    id: str | None = None
    call: int | None = None
    voice: str | None = None  # unknown_voice
    available: list[str] | None = None  # unknown_voice
    cause: str | None = None  # synthesis_failed: bad_argument, voice_error or synthesis_failed
    in_flight: int | None = None


@frame("result")
@dataclass(frozen=True, slots=True, kw_only=True)
class Result(Frame):
    """A call's answer: the voice set now, and the worker's report."""

    call: int
    voices: list[str]
    default_voice: str
    report: Report | None = None


@frame("voices")
@dataclass(frozen=True, slots=True, kw_only=True)
class VoicesChanged(Frame):
    """Another connection (a second gateway) added or removed a voice."""

    change: str  # add | remove
    name: str
    voices: list[str]
    default_voice: str


@frame("report")
@dataclass(frozen=True, slots=True, kw_only=True)
class LoadReport(Frame):
    """The load changed without an ``end`` (an abort, a connection gone)."""

    report: Report


CLIENT_FRAMES = (Auth, Synth, Credit, Ahead, Abort, VoiceAdd, VoiceRemove, Health)
WORKER_FRAMES = (Hello, Chunk, End, Error, Result, VoicesChanged, LoadReport)


# -- documentation -------------------------------------------------------------------------------


def markdown_tables() -> str:
    """The frame tables of docs/engine-workers.md, written from the structs (a test keeps them equal)."""
    out = []
    for title, group in (("Client → worker", CLIENT_FRAMES), ("Worker → client", WORKER_FRAMES)):
        out += [title, "", "| `t` | fields | what |", "| --- | --- | --- |"]
        for cls in group:
            doc = " ".join((cls.__doc__ or "").split()).replace("``", "`")
            out.append(f"| `{cls.T}` | {_field_list(cls)} | {doc} |")
        out.append("")
    report = ", ".join(_field_text(item, hint) for item, hint in _fields_of(Report))
    info = ", ".join(_field_text(item, hint) for item, hint in _fields_of(EngineInfo))
    out += [f"`Report`: {report}.", "", f"`EngineInfo`: {info}."]
    return "\n".join(out)


def _fields_of(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    return [(item, hints[item.name]) for item in dataclasses.fields(cls)]


def _field_list(cls: type) -> str:
    parts = []
    for item, hint in _fields_of(cls):
        if item.metadata.get("flatten"):
            parts.append(f"the fields of `{hint.__name__}`")
        else:
            parts.append(_field_text(item, hint))
    return ", ".join(parts)


def _field_text(item: dataclasses.Field[Any], hint: Any) -> str:
    required = item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
    return f"`{item.name}` {_type_name(hint)}" + ("" if required else " (optional)")


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("nil" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    name = str(getattr(hint, "__name__", hint))
    return f"`{name}`" if dataclasses.is_dataclass(hint) else name


if __name__ == "__main__":
    print(markdown_tables())
