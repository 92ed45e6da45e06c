"""The stages of an official model directory, each built from its config section and its checkpoint.

:func:`~cosyvoice.config.load_config` says what a directory holds; these build the modules from it: the
speech LM (``llm.pt``, or ``llm.rl.pt``), the flow (``flow.pt``; its sizes from the tensors, its streaming
constants from the yaml) and the vocoder (``hift.pt``, with the fixed noise buffers an official process
draws). :class:`~cosyvoice.token2wav.Token2Wav` and :class:`~cosyvoice.model.CosyVoice3` load through here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cosyvoice.checkpoint import load_module_state, load_state_dict
from cosyvoice.config import CosyVoice3Config, load_config
from cosyvoice.flow import Flow
from cosyvoice.hift import CausalHift, HiftError, HiftNoiseBuffers, fold_hift_state
from cosyvoice.hift.buffers import FULL_NOISE_SAMPLES, hift_buffers_from_rng_state, official_hift_rng_state
from cosyvoice.llm import CosyVoice3LM

__all__ = ["load_flow", "load_hift", "load_llm", "official_hift_buffers"]


def load_llm(
    model_dir: str | Path | None = None,
    *,
    config: CosyVoice3Config | None = None,
    use_rl_llm: bool = False,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CosyVoice3LM:
    """The speech LM: geometry from the directory's config, weights from ``llm.pt`` (``llm.rl.pt``)."""
    config = load_config(model_dir) if config is None else config
    model = CosyVoice3LM.from_config(config.llm)
    model.load_checkpoint(config.files.llm_rl if use_rl_llm else config.files.llm)
    return model.to(device=device, dtype=dtype).eval()


def load_flow(
    config: CosyVoice3Config, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Flow:
    """The flow of ``flow.pt`` with the yaml's chunk mask, token/mel ratio and guidance rate."""
    flow = config.flow
    return Flow.from_pretrained(
        config.files.flow,
        static_chunk_size=flow.dit.static_chunk_size,
        num_decoding_left_chunks=flow.dit.num_decoding_left_chunks,
        token_mel_ratio=flow.token_mel_ratio,
        inference_cfg_rate=flow.cfm.inference_cfg_rate,
    ).to(device=device, dtype=dtype)


def official_hift_buffers(
    config: CosyVoice3Config, *, num_samples: int = FULL_NOISE_SAMPLES, with_uv: bool = False
) -> HiftNoiseBuffers:
    """The buffers an official process builds for this model (``num_samples`` keeps a prefix)."""
    state = official_hift_rng_state(
        flow_vocab_size=config.flow.vocab_size,
        flow_mel_dim=config.flow.mel_dim,
        spk_embed_dim=config.flow.spk_embed_dim,
        f0_in_channels=config.hift.f0_in_channels,
        f0_cond_channels=config.hift.f0_cond_channels,
        f0_num_class=config.hift.f0_num_class,
        flow_noise_frames=config.flow.cfm.noise_frames,
        flow_noise_seed=config.flow.cfm.noise_seed,
    )
    return hift_buffers_from_rng_state(
        state, num_harmonics=config.hift.nb_harmonics + 1, num_samples=num_samples, with_uv=with_uv
    )


def load_hift(
    config: CosyVoice3Config,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    max_seconds: float | None = None,
) -> CausalHift:
    """``hift.pt`` of the model directory in a :class:`CausalHift` in eval mode.

    ``max_seconds`` bounds the noise buffer (and so the longest utterance); None keeps upstream's 300 s
    (about 260 MB). ``dtype`` applies to the decoder; f0 stays float64 and the source/STFT float32.
    """
    num_samples = FULL_NOISE_SAMPLES
    if max_seconds is not None:
        num_samples = int(max_seconds * config.hift.sampling_rate)
        if not 0 < num_samples <= FULL_NOISE_SAMPLES:
            raise HiftError(f"max_seconds must be in (0, {FULL_NOISE_SAMPLES / config.hift.sampling_rate}]")
    path = config.files.hift
    state = fold_hift_state(load_state_dict(path), path)
    model = CausalHift(config.hift, official_hift_buffers(config, num_samples=num_samples))
    load_module_state(model, state, path)
    return model.to(device=device, dtype=dtype).eval()
