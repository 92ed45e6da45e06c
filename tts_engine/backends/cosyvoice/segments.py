"""A CosyVoice request's text made into its segments (request.py): upstream's frontend split, then for
each piece its LLM request (prompt, seeded sampler, KV slot fit) and its token2wav stream."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from cosyvoice.flow.chunk_cache import FlowCacheManager
from cosyvoice.frontend.speaker import SpeakerError
from cosyvoice.llm import LLMInputError
from cosyvoice.model import CosyVoice3
from cosyvoice.text.prompt import TextError, prepare_tts_texts
from tts_engine.backends.cosyvoice.request import Segment, SpeedScaledStream, fit_kv_slot, segment_seed
from tts_engine.backends.cosyvoice.voices import PreparedVoice

__all__ = ["open_segments"]


def open_segments(
    model: CosyVoice3,
    text: str,
    voice: PreparedVoice,
    speed: float,
    instruct: str | None,
    name: str,
    *,
    seed: int | None,
    fixed_llm_tokens: int | Callable[[str], int] | None,
    max_llm_len: int,
    shared: bool,
    flow_cache: FlowCacheManager | None,
    final_pass: str,
) -> list[Segment]:
    """``text``'s segments in ``voice`` (``name`` seeds each piece's sampler with ``seed``); ValueError
    for a piece the model cannot read. ``shared``: the voice's prompt chunks are cached for later streams."""
    # numbers, dates, units were read out by the engine's text normaliser (tts.text_normalization)
    texts = prepare_tts_texts(text.strip(), model.tokenizer.encode, spell_numbers=False)
    pieces = [p for p in texts if p.strip()]
    mode = "instruct" if instruct else "zero_shot"
    num_prompt = int(voice.flow_prompt.prompt_token.shape[0])
    segments: list[Segment] = []
    for piece in pieces:
        try:
            prompt = model.build_llm_prompt(piece, voice.record, mode, instruct or None)
            piece_seed = segment_seed(seed, piece, name, instruct)
            generator = torch.Generator(device="cpu").manual_seed(piece_seed)
            llm = model.new_llm_request(prompt, generator=generator, num_prompt_tokens=num_prompt)
            if fixed_llm_tokens is not None:
                fixed = fixed_llm_tokens
                llm.lengths = dataclasses.replace(llm.lengths, mask_all_stops_before_min=True)
                llm.min_len = llm.max_len = max(1, int(fixed(piece) if callable(fixed) else fixed))
        except (TextError, LLMInputError, SpeakerError) as exc:
            raise ValueError(f"cannot synthesise {piece[:40]!r}: {exc}") from exc
        fit_kv_slot(llm, max_llm_len)
        t2w = model.token2wav
        if speed == 1:
            wave = t2w.stream(voice.flow_prompt, share_prompt=shared, flow_cache=flow_cache, final_pass=final_pass)
        else:
            wave = SpeedScaledStream(t2w, voice.flow_prompt, speed=speed)
        segments.append(Segment(piece, llm, wave))
    return segments
