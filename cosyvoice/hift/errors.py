"""Typed errors raised by the HiFT vocoder package."""

from __future__ import annotations


class HiftError(ValueError):
    """Base class of every error the HiFT package raises on purpose."""


class HiftInputError(HiftError):
    """A vocoder call got a mel or lengths of the wrong shape, dtype or size."""
