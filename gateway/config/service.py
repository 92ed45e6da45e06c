"""The `service` section: API keys as accounts with limits, usage metering (gateway/service, docs/service.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config.base import Section


class ServiceConfig(Section):
    """Keys as accounts (config keys and keys in the store), their limits and the usage meter."""

    # auto: a key is needed once one exists (api.api_keys, or a key ever added with `python -m gateway keys add`,
    # revoked or not);
    # always: a key is needed even before any exists (a gateway whose store is down at start-up stays shut).
    require_keys: Literal["auto", "always"] = "auto"
    # How long a key found (or not found) in the store is trusted before it is looked up again: a revoked
    # key stops working within this time; while the store is down, keys seen before keep working.
    key_refresh_s: float = Field(5.0, gt=0, le=3600)
    # Keys remembered in memory (found and not found), the oldest forgotten first.
    key_cache_size: int = Field(10_000, ge=16, le=1_000_000)
    # Usage counters are written to the store in one transaction per this many seconds (and at shutdown).
    usage_flush_s: float = Field(1.0, gt=0, le=300)
    # Prometheus labels: the first this many key names get a label of their own, later ones share
    # `other`; requests with a key that is not valid share `unknown` (bounded cardinality).
    metrics_max_keys: int = Field(50, ge=1, le=10_000)
