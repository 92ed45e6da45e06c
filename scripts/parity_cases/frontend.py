"""Parity handlers for the ``frontend_whisper_mel``, ``frontend_campplus_fbank`` and
``frontend_flow_mel`` case kinds."""

from __future__ import annotations

from torch import Tensor

from cosyvoice.frontend.features import campplus_fbank, flow_mel, whisper_log_mel
from scripts.parity_cases import Handler, ParityContext


def whisper_mel(ctx: ParityContext, case: dict, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    return {"log_mel": whisper_log_mel(inputs["wav16k"].to(ctx.device)).cpu()}  # [1, 128, N // 160]


def campplus(ctx: ParityContext, case: dict, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    return {"fbank": campplus_fbank(inputs["wav16k"].to(ctx.device)).cpu()}  # [T, 80]


def flow_prompt_mel(ctx: ParityContext, case: dict, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    feature = ctx.config.feature
    mel = flow_mel(
        inputs["wav24k"].to(ctx.device),
        n_fft=feature.n_fft,
        num_mels=feature.num_mels,
        sample_rate=feature.sampling_rate,
        hop_size=feature.hop_size,
        win_size=feature.win_size,
        fmin=feature.fmin,
        fmax=feature.fmax,
    )
    return {"speech_feat": mel.cpu()}  # [1, T, 80]


HANDLERS: dict[str, Handler] = {
    "frontend_whisper_mel": whisper_mel,
    "frontend_campplus_fbank": campplus,
    "frontend_flow_mel": flow_prompt_mel,
}
