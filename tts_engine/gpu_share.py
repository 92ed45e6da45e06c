"""Each process caps its own CUDA memory at the shares of the models it holds (docs/gpu-sharing.md).

``torch.cuda.set_per_process_memory_fraction`` caps one process. A process records the share of each
model it holds (``claim_gpu_share``: a role, ``tts`` or ``asr``, and its GiB) and is capped at their
sum on that device, so:

* the gateway with the engine in-process holds both: TTS share + ASR share = ``gpu.memory_gib``
  (today's single cap, whichever model loads first);
* an engine worker process holds the TTS engine only (``apply_engine_share``, its start-up call);
* the gateway with the engine in workers holds the ASR only (gateway/asr/gpu_share.py).

A role whose share is ``None`` (no plan) leaves the whole process uncapped, as without a plan today.
On the CPU nothing is capped.
"""

from __future__ import annotations

import logging
import threading

import torch

log = logging.getLogger(__name__)

GIB = 1 << 30

_lock = threading.Lock()
_shares: dict[int, dict[str, float | None]] = {}  # device index -> role -> fraction of the device
_applied: dict[int, float] = {}  # device index -> the fraction set on it


def device_index(device: str) -> int:
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def claim_gpu_share(
    role: str, device: str, *, gib: float | None = None, fraction: float | None = None
) -> float | None:
    """Record that ``role`` of this process may use ``gib`` GiB (or ``fraction`` of the device) on
    ``device`` (None for both: no limit), then cap the process at the sum of its roles' shares.

    Returns the fraction now set on that device (1.0 when a role without a share lifted an earlier
    cap); None when nothing was capped (CPU, or no share at all). Claiming a role again replaces its
    share.
    """
    if not device.startswith("cuda"):
        return None
    index = device_index(device)
    share = fraction
    if share is None and gib is not None:
        share = gib * GIB / torch.cuda.get_device_properties(index).total_memory
    with _lock:
        roles = _shares.setdefault(index, {})
        roles[role] = share
        values = list(roles.values())
        cap = None if any(v is None for v in values) else min(1.0, sum(v for v in values if v is not None))
        if cap is None:
            if index not in _applied:
                return None
            cap = 1.0  # an uncapped role lifts an earlier cap
        torch.cuda.set_per_process_memory_fraction(cap, index)
        _applied[index] = cap
    log.info("GPU plan: this process capped at %.3f of cuda:%d (shares: %s)", cap, index, roles)
    return cap


def engine_share_gib(
    *, memory_gib: float, asr_memory_gib: float, engine_gpu_memory_gib: float | None, own_process: bool
) -> tuple[float | None, float | None]:
    """The TTS engine's share as (GiB, fraction of the device); (None, None): no cap.

    With a GPU plan (``gpu.memory_gib``) it is the plan's TTS part, ``memory_gib - asr_memory_gib``
    (``engine.gpu_memory_gib`` is validated to fit in it and is what the engine plans with). Without
    one, an engine in its own process (``own_process``) is capped at ``engine.gpu_memory_gib`` (GiB,
    or a fraction of the device when <= 1); in the gateway process nothing is capped, as before.
    """
    if memory_gib:
        return memory_gib - asr_memory_gib, None
    if own_process and engine_gpu_memory_gib is not None:
        if engine_gpu_memory_gib <= 1:
            return None, engine_gpu_memory_gib
        return engine_gpu_memory_gib, None
    return None, None


def apply_engine_share(
    device: str,
    *,
    memory_gib: float = 0.0,
    asr_memory_gib: float = 2.0,
    engine_gpu_memory_gib: float | None = None,
    own_process: bool = True,
) -> float | None:
    """Cap this process for the TTS engine it holds: the engine worker's start-up call (``own_process``)
    and the gateway's when the engine runs in it (``own_process=False``). The fraction set, or None."""
    gib, fraction = engine_share_gib(
        memory_gib=memory_gib,
        asr_memory_gib=asr_memory_gib,
        engine_gpu_memory_gib=engine_gpu_memory_gib,
        own_process=own_process,
    )
    return claim_gpu_share("tts", device, gib=gib, fraction=fraction)


def reset_gpu_shares() -> None:
    """Forget every claim (tests); the caps already set stay."""
    with _lock:
        _shares.clear()
        _applied.clear()
