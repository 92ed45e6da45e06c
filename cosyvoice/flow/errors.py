"""Typed errors raised by the flow (tokens -> mel) stage."""

from __future__ import annotations


class FlowError(ValueError):
    """Base class of every error the flow package raises on purpose."""


class FlowCheckpointError(FlowError):
    """A flow state dict is missing a key, has an unexpected key or a tensor of the wrong shape."""


class FlowInputError(FlowError):
    """An inference call got inputs of the wrong shape, dtype, range or length."""
