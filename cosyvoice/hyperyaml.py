"""Read a HyperPyYAML file (the format of ``cosyvoice3.yaml``) as plain data, executing nothing.

HyperPyYAML adds tags to YAML: ``!new:pkg.Class`` (build an object from the mapping below it),
``!name:pkg.func`` (a partial), ``!apply:pkg.func`` (call at load time), ``!ref <key>`` (a reference
to another node, optionally inside arithmetic such as ``!ref <chunk_size> * <token_mel_ratio>``),
``!copy <key>`` and ``!tuple``. Here every object-building tag becomes a :class:`Tagged` value that
records the tag and its arguments, and references are resolved to the values they point at.
"""

from __future__ import annotations

import ast
import copy
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["HyperYamlError", "NodeReader", "Tagged", "load_hyperyaml", "parse_hyperyaml"]


class HyperYamlError(ValueError):
    """The file is not valid YAML, uses an unknown tag, or has a reference that cannot be resolved."""


@dataclass(frozen=True, slots=True)
class Tagged:
    """A ``!new:`` / ``!name:`` / ``!apply:`` node, recorded instead of executed.

    ``kind`` is ``"new"``, ``"name"`` or ``"apply"``; ``target`` the dotted class or function path;
    ``args`` the node under the tag: a dict (keyword arguments), a list (positional) or None.
    """

    kind: str
    target: str
    args: Any


@dataclass(frozen=True, slots=True)
class _Ref:
    expr: str  # the text after !ref / !copy, e.g. "<chunk_size> * <token_mel_ratio>"
    deep_copy: bool


class _Loader(yaml.SafeLoader):
    """SafeLoader plus the HyperPyYAML tags and YAML 1.2 floats without a dot (``1e-06``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _construct_tagged(kind: str) -> Callable[[yaml.Loader, str, yaml.Node], Tagged]:
    def construct(loader: yaml.Loader, suffix: str, node: yaml.Node) -> Tagged:
        if isinstance(node, yaml.MappingNode):
            args: Any = loader.construct_mapping(node, deep=True)
        elif isinstance(node, yaml.SequenceNode):
            args = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_scalar(node)
            args = None if value == "" else value
        return Tagged(kind, suffix, args)

    return construct


def _construct_ref(deep_copy: bool) -> Callable[[yaml.Loader, yaml.Node], _Ref]:
    def construct(loader: yaml.Loader, node: yaml.Node) -> _Ref:
        return _Ref(str(loader.construct_scalar(node)), deep_copy)

    return construct


def _construct_tuple(loader: yaml.Loader, node: yaml.Node) -> tuple[Any, ...]:
    return tuple(loader.construct_sequence(node, deep=True))


for _kind in ("new", "name", "apply"):
    _Loader.add_multi_constructor(f"!{_kind}:", _construct_tagged(_kind))
_Loader.add_constructor("!ref", _construct_ref(deep_copy=False))
_Loader.add_constructor("!copy", _construct_ref(deep_copy=True))
_Loader.add_constructor("!tuple", _construct_tuple)

_REF_PATTERN = re.compile(r"<([^<>]+)>")
_KEY_PART = re.compile(r"[^.\[\]]+")
_BIN_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval_arithmetic(node: ast.AST, names: Mapping[str, Any]) -> Any:
    """Evaluate +, -, *, /, //, %, ** over numbers; raise ValueError on anything else."""
    if isinstance(node, ast.Expression):
        return _eval_arithmetic(node.body, names)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        value = names[node.id]
        if type(value) in (int, float):
            return value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
        return _BIN_OPS[type(node.op)](
            _eval_arithmetic(node.left, names), _eval_arithmetic(node.right, names)
        )
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_eval_arithmetic(node.operand, names))
    raise ValueError("not plain arithmetic")


class _Resolver:
    def __init__(self, root: dict[str, Any], source: str) -> None:
        self._root = root
        self._source = source
        self._active: list[str] = []

    def resolve(self, value: Any) -> Any:
        if isinstance(value, _Ref):
            return self._resolve_ref(value)
        if isinstance(value, Tagged):
            return Tagged(value.kind, value.target, self.resolve(value.args))
        if isinstance(value, dict):
            return {key: self.resolve(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.resolve(item) for item in value]
        if isinstance(value, tuple):
            return tuple(self.resolve(item) for item in value)
        return value

    def _lookup(self, key: str) -> Any:
        if key in self._active:
            chain = " -> ".join([*self._active, key])
            raise HyperYamlError(f"{self._source}: circular !ref: {chain}")
        node: Any = self._root
        for part in _KEY_PART.findall(key):
            if isinstance(node, Tagged):
                node = node.args
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise HyperYamlError(f"{self._source}: !ref <{key}> points at no node")
        self._active.append(key)
        try:
            return self.resolve(node)
        finally:
            self._active.pop()

    def _resolve_ref(self, ref: _Ref) -> Any:
        expr = ref.expr.strip()
        keys = _REF_PATTERN.findall(expr)
        if not keys:
            raise HyperYamlError(f"{self._source}: !ref {expr!r} names no <key>")
        whole = _REF_PATTERN.fullmatch(expr)
        if whole is not None:
            value = self._lookup(whole.group(1).strip())
            return copy.deepcopy(value) if ref.deep_copy else value
        values = [self._lookup(key.strip()) for key in keys]
        names = {f"_ref{i}": value for i, value in enumerate(values)}
        counter = iter(range(len(values)))
        python_expr = _REF_PATTERN.sub(lambda _: f"_ref{next(counter)}", expr)
        try:
            return _eval_arithmetic(ast.parse(python_expr, mode="eval"), names)
        except (SyntaxError, ValueError, ArithmeticError):
            texts = iter(str(value) for value in values)
            return _REF_PATTERN.sub(lambda _: next(texts), expr)


def parse_hyperyaml(
    text: str, *, overrides: Mapping[str, Any] | None = None, source: str = "<string>"
) -> dict[str, Any]:
    """Parse HyperPyYAML text into plain data; ``overrides`` replace top-level keys before resolution."""
    try:
        root = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise HyperYamlError(f"{source}: {exc}") from exc
    if not isinstance(root, dict):
        raise HyperYamlError(f"{source}: the top level must be a mapping")
    root.update(overrides or {})
    return _Resolver(root, source).resolve(root)


def load_hyperyaml(path: str | Path, *, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Read and parse a HyperPyYAML file; see :func:`parse_hyperyaml`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise HyperYamlError(f"{path}: file not found") from exc
    return parse_hyperyaml(text, overrides=overrides, source=str(path))


class NodeReader:
    """Typed access to one mapping of a parsed file; errors name the file and the dotted key.

    ``error`` is the exception class raised (a ValueError subclass taking one message).
    """

    def __init__(
        self, data: Any, where: str, source: str | Path, error: type[ValueError] = HyperYamlError
    ) -> None:
        if not isinstance(data, Mapping):
            raise error(f"{source}: {where or 'top level'} must be a mapping")
        self.data = data
        self.where = where
        self.source = source
        self.error = error

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def _key(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str) -> Any:
        if key not in self.data:
            raise self.error(f"{self.source}: missing key {self._key(key)!r}")
        return self.data[key]

    def _typed(self, key: str, types: tuple[type, ...], what: str) -> Any:
        value = self.get(key)
        if type(value) not in types:
            raise self.error(f"{self.source}: {self._key(key)!r} must be {what}, got {value!r}")
        return value

    def int(self, key: str) -> int:
        return self._typed(key, (int,), "an integer")

    def float(self, key: str) -> float:
        return float(self._typed(key, (int, float), "a number"))

    def optional_float(self, key: str) -> float | None:
        return None if self.get(key) is None else self.float(key)

    def str(self, key: str) -> str:
        return self._typed(key, (str,), "a string")

    def bool(self, key: str) -> bool:
        return self._typed(key, (bool,), "true or false")

    def ints(self, key: str) -> tuple[int, ...]:
        value = self.get(key)
        if not isinstance(value, list | tuple) or any(type(item) is not int for item in value):
            raise self.error(f"{self.source}: {self._key(key)!r} must be a list of integers, got {value!r}")
        return tuple(value)

    def int_lists(self, key: str) -> tuple[tuple[int, ...], ...]:
        value = self.get(key)
        ok = isinstance(value, list | tuple) and all(
            isinstance(row, list | tuple) and all(type(item) is int for item in row) for row in value
        )
        if not ok:
            raise self.error(f"{self.source}: {self._key(key)!r} must be a list of integer lists")
        return tuple(tuple(row) for row in value)

    def sub(self, key: str, target: str | None = None) -> NodeReader:
        """The mapping under ``key``; with ``target``, the arguments of a ``!new:<target>`` node."""
        value = self.get(key)
        if target is not None and (
            not isinstance(value, Tagged) or value.kind != "new" or value.target != target
        ):
            got = f"!{value.kind}:{value.target}" if isinstance(value, Tagged) else repr(value)
            raise self.error(f"{self.source}: {self._key(key)!r} must be !new:{target}, got {got}")
        if isinstance(value, Tagged):
            value = value.args if value.args is not None else {}
        return NodeReader(value, self._key(key), self.source, self.error)
