"""A step's audio, from backend chunks to int16 at each stream's rate, as a few batched device ops.

Chunks are grouped by (output rate, device): each group is resampled with one conv
(``resample.process_batch``), converted to int16 on its device, concatenated and copied to the host
once; the host splits the copy per stream. Results equal the per-stream path
(``EngineRequest.to_pcm``) up to float rounding of the conv.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tts_engine.request import EngineRequest, as_float_tensor
from tts_engine.resample import process_batch

__all__ = ["int16_on_device", "postprocess_chunks"]


def int16_on_device(audio: torch.Tensor) -> torch.Tensor:
    """Float PCM in [-1, 1] to int16 where it lives: scale, round half to even, clip; NaN is silence."""
    audio = torch.nan_to_num(audio.to(torch.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    return torch.round(audio * 32767.0).clamp_(-32768, 32767).to(torch.int16)


def postprocess_chunks(items: list[tuple[EngineRequest, Any]]) -> list[np.ndarray | BaseException]:
    """One int16 ``np.ndarray`` per (request, chunk), or the error that chunk raised (that request only)."""
    results: list[np.ndarray | BaseException | None] = [None] * len(items)
    rows: list[int] = []
    tensors: list[torch.Tensor] = []
    for i, (request, chunk) in enumerate(items):
        try:
            if request.resampler is None:
                raise ValueError(f"request {request.req_id} has no open stream")
            tensors.append(as_float_tensor(chunk))
            rows.append(i)
        except Exception as exc:  # noqa: BLE001 - a bad chunk fails only its request
            results[i] = exc
    if rows:
        try:
            resampled = process_batch([items[i][0].resampler for i in rows], tensors)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - find the culprit row by row
            resampled = _one_by_one([items[i][0] for i in rows], tensors)
        by_device: dict[torch.device, list[int]] = {}
        for k, out in enumerate(resampled):
            if isinstance(out, BaseException):
                results[rows[k]] = out
            else:
                by_device.setdefault(out.device, []).append(k)
        for ks in by_device.values():
            pcm = int16_on_device(torch.cat([resampled[k] for k in ks]))  # [sum of lengths]
            host = pcm.cpu().numpy()  # the group's one device -> host copy
            offset = 0
            for k in ks:
                size = resampled[k].shape[0]
                results[rows[k]] = host[offset : offset + size]
                offset += size
    return [r if r is not None else np.zeros(0, np.int16) for r in results]


def _one_by_one(requests: list[EngineRequest], tensors: list[torch.Tensor]) -> list[Any]:
    out: list[Any] = []
    for request, tensor in zip(requests, tensors, strict=True):
        try:
            out.append(request.resampler.process(tensor))  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001
            out.append(exc)
    return out
