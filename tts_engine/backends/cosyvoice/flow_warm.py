"""Fill a prepared voice's flow prompt cache when the voice is added, not at its first request.

The per-voice prefix (cosyvoice/flow/chunk_cache.py) holds the flow state of the prompt's complete
chunks whose tokens and look-ahead tokens are all prompt tokens. Without warming, the first request of a
voice computes and offers them on its first hop, which makes that hop the slowest of all. Here one
streaming, non-final flow call runs over the prompt plus the ``pre_lookahead_len`` tokens a non-final call
needs (their ids do not matter: the frames they condition lie after the voice-only chunks and are thrown
away), with a fresh stream cache that wants the voice's prefix; the solver offers the voice-only chunks to
the manager (within its byte budget, evicting least recently used prefixes) and the stream cache is
released right after, so only the prefix stays charged.

The call uses the solver settings every request uses (the flow's defaults), so its cache key matches.
"""

from __future__ import annotations

import logging

import torch

from cosyvoice.flow.chunk_cache import FlowCacheManager
from cosyvoice.token2wav import SpeakerPrompt, Token2Wav

__all__ = ["warm_voice_prefix"]

log = logging.getLogger(__name__)


@torch.inference_mode()
def warm_voice_prefix(token2wav: Token2Wav, prompt: SpeakerPrompt, manager: FlowCacheManager) -> bool:
    """Compute and register ``prompt``'s voice prefix in ``manager``; True when it is cached afterwards.

    Nothing is done when it is cached already, the prompt has no voice-only chunk, or the flow has no
    reusable chunks (limited left context); a prefix that does not fit the budget is skipped.
    """
    if manager.has_voice(prompt):
        return True
    flow = token2wav.flow
    lookahead, ratio = flow.cfg.pre_lookahead_len, flow.cfg.token_mel_ratio
    chunk = flow.decoder.estimator.cfg.static_chunk_size
    num_prompt = int(prompt.prompt_token.shape[0])
    if chunk <= 0 or (num_prompt - lookahead) * ratio < chunk:
        return False  # no complete voice-only chunk (or no chunked attention): nothing to share
    cache = manager.stream_cache(prompt)
    try:
        # The same host tensors Token2Wav._flow_batch builds for a one-row batch.
        flow.inference(
            torch.zeros(1, lookahead, dtype=torch.int32),
            [lookahead],
            prompt.prompt_token.to(torch.int32).cpu()[None],
            [num_prompt],
            prompt.prompt_feat.float().cpu()[None],
            [int(prompt.prompt_feat.shape[0])],
            prompt.embedding.float().cpu()[None],
            streaming=[True],
            finalize=[False],
            caches=[cache],
            skip_frames=[0],
        )
    finally:
        cache.release()  # the stream's own chunks go back; a registered prefix stays
    cached = manager.has_voice(prompt)
    if not cached:
        log.debug(
            "flow cache: voice prefix not kept (%d tokens; budget %d bytes)", num_prompt, manager.limit_bytes
        )
    return cached
