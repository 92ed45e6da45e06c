"""Parity handlers for the ``hift_offline``, ``hift_stream`` and ``fixed_buffers`` case kinds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cosyvoice.hift import CausalHift, hift_buffers_from_rng_state, official_flow_noise
from cosyvoice.pretrained import load_hift, official_hift_buffers


def hift_model(ctx: Any) -> CausalHift:
    """The vocoder of the fixture model, built once per run (shared with the token2wav handler)."""
    if "hift" not in ctx.cache:
        ctx.cache["hift"] = load_hift(ctx.config, device=ctx.device)
    return ctx.cache["hift"]


def hift_offline(ctx: Any, case: dict, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.inference_mode():
        out = hift_model(ctx)(inputs["mel"], finalize=True)
    return {"speech": out.speech.cpu(), "source": out.source.cpu()}


def hift_stream(ctx: Any, case: dict, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    hift, mel = hift_model(ctx), inputs["mel"]
    prefix_lens = [int(n) for n in case["params"]["prefix_lens"]]
    result, emitted = {}, 0
    with torch.inference_mode():
        for i, n in enumerate(prefix_lens):
            out = hift(mel[:, :, :n], finalize=i == len(prefix_lens) - 1)
            result[f"speech.{i}"] = out.speech[:, emitted:].cpu()  # [1, new samples]
            emitted = out.speech.shape[1]
    return result


def fixed_buffers(ctx: Any, case: dict, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    params = case["params"]
    n_samples, n_frames = int(params["n_samples"]), int(params["n_frames"])
    config = ctx.config
    buffers = hift_buffers_from_rng_state(
        inputs["hift_rng_state"],
        num_harmonics=config.hift.nb_harmonics + 1,
        num_samples=n_samples,
        with_uv=True,
    )
    ours = official_hift_buffers(config, num_samples=n_samples)  # what load_hift uses (replayed state)
    if not torch.equal(ours.sine_noise, buffers.sine_noise) or not torch.equal(
        ours.rand_ini, buffers.rand_ini
    ):
        print("fixed_buffers: WARNING replayed construction-order RNG state differs from the fixture's")
    noise = official_flow_noise(frames=config.flow.cfm.noise_frames, seed=config.flow.cfm.noise_seed)
    if buffers.uv_noise is None:
        raise RuntimeError("uv noise buffer was not drawn")
    return {
        "flow_rand_noise": noise[:, :, :n_frames],
        "hift_rand_ini": buffers.rand_ini,
        "hift_sine_noise": buffers.sine_noise,
        "hift_uv_noise": buffers.uv_noise[:, :n_samples],
    }


HANDLERS: dict[str, Callable[[Any, dict, dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "hift_offline": hift_offline,
    "hift_stream": hift_stream,
    "fixed_buffers": fixed_buffers,
}
