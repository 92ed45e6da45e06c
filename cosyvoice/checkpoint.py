"""Load official CosyVoice3 state dicts (``llm.pt``, ``flow.pt``, ``hift.pt``) safely and check them.

Files are read with ``torch.load(weights_only=True, map_location="cpu")``. Weight-normed convolutions
come in two key styles, ``<m>.weight_g``/``<m>.weight_v`` (old torch) and
``<m>.parametrizations.weight.original0``/``original1`` (new torch); :func:`fold_weight_norm` turns
either into a plain ``<m>.weight`` = g * v / ||v||, the norm taken over every dim except dim 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor

__all__ = [
    "CheckpointError",
    "check_keys",
    "check_shapes",
    "fold_weight_norm",
    "load_module_state",
    "load_state_dict",
    "strip_prefix",
]

_NEW_STYLE = (".parametrizations.weight.original0", ".parametrizations.weight.original1")
_OLD_STYLE = (".weight_g", ".weight_v")
_MAX_LISTED = 10


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable, or its keys/shapes do not fit the model."""

    def __init__(
        self,
        file: str | Path,
        message: str,
        *,
        missing: Iterable[str] = (),
        unexpected: Iterable[str] = (),
    ) -> None:
        self.file = str(file)
        self.missing = sorted(missing)
        self.unexpected = sorted(unexpected)
        super().__init__(f"{self.file}: {message}")


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_LISTED])
    return shown + (f", ... ({len(keys) - _MAX_LISTED} more)" if len(keys) > _MAX_LISTED else "")


def load_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Read a ``torch.save``d state dict onto the CPU without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "checkpoint file not found")
    try:
        loaded = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises many types (pickle, zip, weights-only refusals)
        raise CheckpointError(path, f"cannot read checkpoint: {exc}") from exc
    if not isinstance(loaded, Mapping):
        raise CheckpointError(path, f"expected a state dict (mapping), got {type(loaded).__name__}")
    not_tensors = [str(key) for key, value in loaded.items() if not isinstance(value, Tensor)]
    if not_tensors:
        raise CheckpointError(path, f"entries that are not tensors: {_listed(sorted(not_tensors))}")
    return {str(key): value for key, value in loaded.items()}


def strip_prefix(state_dict: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Drop ``prefix`` from the keys that start with it (e.g. HiFT's optional ``generator.``)."""
    return {
        (key[len(prefix) :] if key.startswith(prefix) else key): value for key, value in state_dict.items()
    }


def _fold(g: Tensor, v: Tensor) -> Tensor:
    # torch's own weight-norm kernel (what the parametrization computes), so the folded weight is
    # bit-identical to the official module's: v * g / ||v||, norm over every dim except 0.
    return torch._weight_norm(v, g.reshape((v.shape[0],) + (1,) * (v.dim() - 1)), 0)


def fold_weight_norm(
    state_dict: Mapping[str, Tensor], *, file: str | Path = "<state dict>"
) -> dict[str, Tensor]:
    """Replace every weight-norm pair (either key style) by the effective ``<m>.weight``."""
    folded: dict[str, Tensor] = {}
    pairs: dict[str, dict[int, Tensor]] = {}
    for key, value in state_dict.items():
        dotted = "." + key  # so that a top-level module's "weight_g" matches ".weight_g"
        for suffixes in (_NEW_STYLE, _OLD_STYLE):
            hit = next((i for i, suffix in enumerate(suffixes) if dotted.endswith(suffix)), None)
            if hit is not None:
                pairs.setdefault(dotted[: -len(suffixes[hit])], {})[hit] = value
                break
        else:
            folded[key] = value
    for module, parts in pairs.items():
        if len(parts) != 2:
            raise CheckpointError(
                file,
                f"weight norm of {module[1:]!r} has only {'g' if 0 in parts else 'v'}",
                missing=[module[1:]],
            )
        g, v = parts[0], parts[1]
        if g.numel() != v.shape[0]:
            raise CheckpointError(
                file, f"weight norm of {module[1:]!r}: g {tuple(g.shape)} vs v {tuple(v.shape)}"
            )
        weight_key = f"{module}.weight"[1:]  # module carries the leading "." added above
        if weight_key in folded:
            raise CheckpointError(file, f"{module[1:]!r} has both a plain weight and a weight-norm pair")
        folded[weight_key] = _fold(g, v)
    return folded


def check_keys(expected: Iterable[str], got: Mapping[str, Tensor], file: str | Path) -> None:
    """Raise CheckpointError naming the file and every missing / unexpected key."""
    expected = set(expected)
    missing = sorted(expected - got.keys())
    unexpected = sorted(got.keys() - expected)
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append(f"missing keys: {_listed(missing)}")
    if unexpected:
        parts.append(f"unexpected keys: {_listed(unexpected)}")
    raise CheckpointError(file, "; ".join(parts), missing=missing, unexpected=unexpected)


def check_shapes(
    expected: Mapping[str, tuple[int, ...]], got: Mapping[str, Tensor], file: str | Path
) -> None:
    """Raise CheckpointError naming the file and every key whose tensor shape differs."""
    wrong = [
        f"{key} {tuple(got[key].shape)} (expected {tuple(shape)})"
        for key, shape in sorted(expected.items())
        if key in got and tuple(got[key].shape) != tuple(shape)
    ]
    if wrong:
        raise CheckpointError(file, f"shape mismatch: {_listed(wrong)}")


def load_module_state(
    module: torch.nn.Module,
    state_dict: Mapping[str, Tensor],
    file: str | Path,
    *,
    ignore: Iterable[str] = (),
) -> None:
    """Strictly load ``state_dict`` into ``module`` after checking keys and shapes.

    ``ignore`` lists checkpoint keys that are allowed to be present but are not loaded (e.g. a tied
    ``lm_head.weight``). Buffers the module registers as non-persistent are not expected.
    """
    ignored = set(ignore)
    wanted = {key: value for key, value in state_dict.items() if key not in ignored}
    own = module.state_dict()
    check_keys(own.keys(), wanted, file)
    check_shapes({key: tuple(value.shape) for key, value in own.items()}, wanted, file)
    module.load_state_dict(wanted, strict=True)
