"""The worker protocol's codec: typed frame structs to msgpack maps and back, checked field by field.

A frame struct is a frozen dataclass registered under its wire type with ``@frame("t")``
(tts_engine/worker/frames.py holds them all). ``encode(frame)`` packs it with its ``"t"``;
``decode(message)`` turns a received map back into its struct, checking every field against the
struct's annotations: ``FrameError`` names the first bad or missing field, ``UnknownFrame`` an unknown
``"t"``. Keys a struct does not know are ignored, so a newer peer may add fields. Field types are what
msgpack carries: str, int, float (an int is one too), bool, bytes, None, lists, string-keyed maps and
nested structs; a field with ``metadata=FLAT`` has its struct's fields in the frame's own map.

Dataclasses over msgpack rather than msgspec (what vLLM uses for its engine-core messages): the worker
must start on a minimal GPU image that has msgpack and no msgspec (docs/gpu-reports/README.md).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import msgpack

F = TypeVar("F", bound="Frame")
Checker = Callable[[Any], Any]
FLAT = {"flatten": True}  # field metadata: the struct's fields sit in the frame's own map


class FrameError(ValueError):
    """A frame of a known type with a field missing or of the wrong type."""


class UnknownFrame(FrameError):
    """A frame whose ``"t"`` names no frame type."""


class Frame:
    """Base of every frame struct; ``T`` is its type on the wire."""

    T: ClassVar[str] = ""
    _codec: ClassVar[_Codec]


_FRAMES: dict[str, type[Frame]] = {}


def frame(type_name: str) -> Callable[[type[F]], type[F]]:
    """Register a frame struct (a frozen dataclass) under ``type_name``."""

    def register(cls: type[F]) -> type[F]:
        cls.T = type_name
        cls._codec = _Codec(cls)
        _FRAMES[type_name] = cls
        return cls

    return register


def encode(item: Frame) -> bytes:
    return msgpack.packb({"t": item.T, **item._codec.to_wire(item)}, use_bin_type=True)


def decode(message: dict[str, Any]) -> Frame:
    """The struct of a received map (``FrameReader`` made sure it is a map with a string ``"t"``)."""
    cls = _FRAMES.get(message["t"])
    if cls is None:
        raise UnknownFrame(f"unknown message type {message['t']!r}")
    return cls._codec.from_wire(message)


# -- the codec -----------------------------------------------------------------------------------


class _Codec:
    """Encodes and checks one struct's fields; built once per struct from its annotations."""

    def __init__(self, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.fields: list[tuple[str, Checker, bool, _Codec | None]] = []  # name, check, required, flattened
        for item in dataclasses.fields(cls):
            required = item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
            flat = _Codec(hints[item.name]) if item.metadata.get("flatten") else None
            self.fields.append((item.name, _checker(item.name, hints[item.name]), required, flat))

    def to_wire(self, item: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, _, _, flat in self.fields:
            value = getattr(item, name)
            if flat is not None:
                out.update(flat.to_wire(value))
            elif dataclasses.is_dataclass(value):
                out[name] = _codec_of(type(value)).to_wire(value)
            else:
                out[name] = value
        return out

    def from_wire(self, message: dict[str, Any]) -> Any:
        values: dict[str, Any] = {}
        for name, check, required, flat in self.fields:
            if flat is not None:
                values[name] = flat.from_wire(message)
            elif name in message:
                values[name] = check(message[name])
            elif required:
                raise FrameError(f"field {name!r} is missing")
        return self.cls(**values)


_STRUCT_CODECS: dict[type, _Codec] = {}


def _codec_of(cls: type) -> _Codec:
    codec = _STRUCT_CODECS.get(cls)
    if codec is None:
        codec = _STRUCT_CODECS[cls] = _Codec(cls)
    return codec


def _checker(name: str, hint: Any) -> Checker:
    """A function that returns a field's value if it fits ``hint``, else raises ``FrameError``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        inner = _checker(name, options[0]) if len(options) == 1 else _fail(name, hint)
        return lambda value: None if value is None else inner(value)
    if origin is list:
        item = _checker(name, args[0])
        return lambda value: [item(v) for v in _expect(name, value, list, "a list")]
    if origin is dict:
        item = _checker(name, args[1])
        return lambda value: {
            _expect(name, k, str, "a map with string keys"): item(v)
            for k, v in _expect(name, value, dict, "a map").items()
        }
    if dataclasses.is_dataclass(hint):
        codec = _codec_of(hint)  # type: ignore[arg-type]
        return lambda value: codec.from_wire(_expect(name, value, dict, "a map"))
    if hint is float:  # an int is a float too (byte counts stay ints)
        return lambda value: _expect(name, value, int | float, "a number", no_bool=True)
    if hint is int:
        return lambda value: _expect(name, value, int, "an integer", no_bool=True)
    if hint is str:
        return lambda value: _expect(name, value, str, "a string")
    if hint is bytes:
        return lambda value: _expect(name, value, bytes, "bytes")
    if hint is bool:
        return lambda value: _expect(name, value, bool, "true or false")
    return _fail(name, hint)


def _expect(name: str, value: Any, kind: Any, what: str, *, no_bool: bool = False) -> Any:
    if not isinstance(value, kind) or (no_bool and isinstance(value, bool)):
        raise FrameError(f"field {name!r} must be {what}, got {type(value).__name__}")
    return value


def _fail(name: str, hint: Any) -> Checker:
    raise TypeError(f"frame field {name!r}: no check for {hint!r}")
