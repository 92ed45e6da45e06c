"""Case handlers for ``scripts/parity.py``, one module per area, discovered automatically.

Each module in this package defines ``HANDLERS: dict[str, Handler]`` mapping a case kind of the
parity fixtures (``cases.json``) to a function ``handler(ctx, case, inputs) -> outputs``:

* ``ctx`` - the :class:`ParityContext` of the run (model directory, shared cache);
* ``case`` - the case entry from ``cases.json`` (``name``, ``kind``, ``params``, ...);
* ``inputs`` - input name -> tensor (the ``<case>.`` prefix stripped);
* ``outputs`` - output name -> tensor; a list of chunks is returned as ``<output>.<i>`` keys.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cosyvoice.config import CosyVoice3Config, load_config
from cosyvoice.text.tokenizer import CosyVoice3Tokenizer

__all__ = ["Handler", "ParityContext", "discover_handlers"]

Handler = Callable[["ParityContext", dict, dict[str, Tensor]], dict[str, Tensor]]


@dataclass
class ParityContext:
    """What every handler may use; ``cache`` holds components built lazily and shared across cases."""

    model_dir: Path
    fixture_dir: Path
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> CosyVoice3Config:
        if "config" not in self.cache:
            self.cache["config"] = load_config(self.model_dir)
        return self.cache["config"]

    @property
    def tokenizer(self) -> CosyVoice3Tokenizer:
        if "tokenizer" not in self.cache:
            self.cache["tokenizer"] = CosyVoice3Tokenizer.from_dir(self.config.files.blank_en)
        return self.cache["tokenizer"]


def discover_handlers() -> tuple[dict[str, Handler], dict[str, str]]:
    """Import every handler module here; return (kind -> handler, module -> import error message).

    A module that fails to import is reported, not fatal: its kinds simply have no handler.
    A kind claimed by two modules is reported as an error of the second module.
    """
    handlers: dict[str, Handler] = {}
    owners: dict[str, str] = {}
    errors: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda item: item.name):
        name = f"{__name__}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # a broken or unfinished area must not stop the others
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        module_handlers = getattr(module, "HANDLERS", None)
        if not isinstance(module_handlers, dict):
            errors[name] = "defines no HANDLERS dict"
            continue
        for kind, handler in module_handlers.items():
            if kind in handlers:
                errors[name] = f"kind {kind!r} is already handled by {owners[kind]}"
                continue
            handlers[kind], owners[kind] = handler, name
    return handlers, errors
