"""Batched generation with the speech LM for a serving scheduler: requests, their sampling, the runner.

Generation follows the reference decode loop, including its quirk: before ``min_len`` only
id 6561 (sos) is masked, so eos and the other stop ids can still end a request early.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import ClassVar

import torch
from torch import nn

from cosyvoice.llm.config import SamplingConfig
from cosyvoice.llm.lm import CosyVoice3LM, LLMInputError, LLMPrompt
from cosyvoice.llm.sampling import RasParams, SilentTokenFilter, make_generator, ras_sample, ras_sample_rows


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LengthRule:
    """min/max generated tokens as multiples of the tts-text token count (prompt text excluded)."""

    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0
    mask_all_stops_before_min: bool = False  # True: fix the reference quirk (mask every stop id)

    def limits(self, num_text_tokens: int) -> tuple[int, int]:
        min_len = int(num_text_tokens * self.min_token_text_ratio)
        return min_len, int(num_text_tokens * self.max_token_text_ratio)


def sampling_from_config(config: SamplingConfig) -> tuple[RasParams, LengthRule]:
    """Request defaults from the model directory's sampling section."""
    ras = RasParams(top_p=config.top_p, top_k=config.top_k, win_size=config.win_size, tau_r=config.tau_r)
    lengths = LengthRule(
        min_token_text_ratio=config.min_token_text_ratio, max_token_text_ratio=config.max_token_text_ratio
    )
    return ras, lengths


@dataclasses.dataclass(frozen=True, slots=True)
class KVSwap:
    """A parked request's cache positions in host memory (one [kv heads, length, head dim] per layer)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int


@dataclasses.dataclass(frozen=True, slots=True)
class StepOutput:
    token: int | None  # the emitted speech token, None when the request stopped without one
    to_flow: bool  # False when the silent-token filter withholds the token from the flow
    finished: bool


class LLMRequest:
    """Per-request generation state; only :class:`LLMRunner` mutates it."""

    def __init__(
        self,
        prompt: LLMPrompt,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        ras: RasParams | None = None,
        lengths: LengthRule | None = None,
        silent_filter: SilentTokenFilter | None = None,
    ) -> None:
        if (seed is None) == (generator is None):
            raise LLMInputError("give exactly one of seed or generator")
        self.prompt = prompt
        self.generator = make_generator(seed) if generator is None else generator
        if self.generator.device.type != "cpu":
            raise LLMInputError("the sampling generator must be a CPU generator")
        self.ras = RasParams() if ras is None else ras
        self.lengths = LengthRule() if lengths is None else lengths
        self.min_len, self.max_len = self.lengths.limits(prompt.text.numel())
        if self.max_len < 1:
            raise LLMInputError(f"max_len is {self.max_len}: text too short for the length ratios")
        self.out_tokens: list[int] = []
        self.flow_tokens: list[int] = []  # out_tokens after the silent-token filter
        self.silent_filter = SilentTokenFilter() if silent_filter is None else silent_filter
        self.slot: int | None = None
        self.swapped: KVSwap | None = None  # its cache in host memory while parked (LLMRunner.swap_out)
        self.finished = False
        self.stop_token: int | None = None  # the stop id that ended it, if any

    @property
    def num_prefix_tokens(self) -> int:
        p = self.prompt
        return 2 + p.prompt_text.numel() + p.text.numel() + p.prompt_speech.numel()

    @property
    def num_cache_positions(self) -> int:
        """Cache positions the request may need: the prefix plus every fed-back token."""
        return self.num_prefix_tokens + self.max_len - 1

    def _sampling_logp(self, logp: torch.Tensor, stop_from: int) -> torch.Tensor:
        """The fp32 CPU log-probs [V] its next draw takes: ``logp``, or below ``min_len`` a copy with the
        stop ids it may not take yet masked."""
        if len(self.out_tokens) >= self.min_len:
            return logp
        logp = logp.clone()
        if self.lengths.mask_all_stops_before_min:
            logp[stop_from:] = -float("inf")
        else:
            logp[stop_from] = -float("inf")  # the reference masks only this id (sos)
        return logp

    def _accept(self, token: int, stop_from: int) -> StepOutput:
        """Take the drawn ``token``: a stop ends the request, any other is emitted."""
        if token >= stop_from:
            self.finished, self.stop_token = True, token
            return StepOutput(None, False, True)
        self.out_tokens.append(token)
        to_flow = self.silent_filter.accept(token)
        if to_flow:
            self.flow_tokens.append(token)
        self.finished = len(self.out_tokens) >= self.max_len
        return StepOutput(token, to_flow, self.finished)


def check_new_requests(requests: Sequence[LLMRequest], *, max_len: int, free_slots: int) -> None:
    """What every runner checks before a prefill: new requests that fit the cache and its slots."""
    for request in requests:
        if request.slot is not None or request.finished:
            raise LLMInputError("prefill takes new requests only")
        if request.num_cache_positions > max_len:
            raise LLMInputError(
                f"request needs {request.num_cache_positions} cache positions, cache max_len {max_len}"
            )
    if len(requests) > free_slots:
        raise LLMInputError(f"{len(requests)} requests but {free_slots} free slots")


def check_running_requests(requests: Sequence[LLMRequest]) -> None:
    """What every runner checks before a decode step: prefilled requests that are still running."""
    for request in requests:
        if request.slot is None or request.finished or not request.out_tokens:
            raise LLMInputError("decode_step takes prefilled, unfinished requests only")


class LLMRunner:
    """Runs batches of :class:`LLMRequest` on one model and one slot cache.

    ``prefill`` admits new requests (allocating slots) and samples their first token;
    ``decode_step`` feeds each active request's last token and samples the next. A request
    frees its slot as soon as it finishes; ``abort`` frees it early. Sampling happens on the
    CPU after one transfer of the batch's log-probs per call.
    """

    reserved_slots: ClassVar[int] = 0  # cache rows past max_batch that a subclass keeps for itself

    def __init__(self, model: CosyVoice3LM, *, max_batch: int, max_len: int) -> None:
        self.model = model
        self.cache = model.new_cache(max_batch=max_batch, max_len=max_len, reserved_slots=self.reserved_slots)

    @property
    def num_free_slots(self) -> int:
        return self.cache.num_free_slots

    @torch.inference_mode()
    def prefill(self, requests: Sequence[LLMRequest]) -> list[StepOutput]:
        if not requests:
            return []
        check_new_requests(requests, max_len=self.cache.max_len, free_slots=self.cache.num_free_slots)
        prefixes = [self.model.embed_prompt(r.prompt) for r in requests]  # each [L_i, H]
        lengths = [p.shape[0] for p in prefixes]
        batch = nn.utils.rnn.pad_sequence(prefixes, batch_first=True)  # [B, Lmax, H]
        for request in requests:
            request.slot = self.cache.allocate()
        try:
            hidden = self.model.model(batch, self.cache, [r.slot for r in requests], lengths)  # [B, Lmax, H]
        except Exception:
            for request in requests:
                self._release(request)
            raise
        last = torch.tensor(lengths, device=hidden.device) - 1  # [B]
        last_hidden = hidden[torch.arange(len(requests), device=hidden.device), last]  # [B, H]
        return self._sample(requests, last_hidden)

    @torch.inference_mode()
    def decode_step(self, requests: Sequence[LLMRequest]) -> list[StepOutput]:
        if not requests:
            return []
        check_running_requests(requests)
        tokens = torch.tensor(
            [r.out_tokens[-1] for r in requests], device=self.model.speech_embedding.weight.device
        )
        embeds = self.model.speech_embedding(tokens)[:, None]  # [B, 1, H]
        hidden = self.model.model(embeds, self.cache, [r.slot for r in requests])  # [B, 1, H]
        return self._sample(requests, hidden[:, 0])

    def abort(self, request: LLMRequest) -> None:
        """Finish ``request`` now and release its slot (no-op when already released)."""
        request.finished = True
        request.swapped = None
        self._release(request)

    def swap_out(self, request: LLMRequest) -> None:
        """Copy ``request``'s cache positions to host memory and free its slot (a parked request; no-op
        without a slot). :meth:`swap_in` puts them back, so its generation goes on exactly where it was."""
        slot = request.slot
        if slot is None or request.swapped is not None:
            return
        n = self.cache.length(slot)
        request.swapped = KVSwap(
            keys=[k[slot, :, :n].to("cpu", copy=True) for k in self.cache.keys],
            values=[v[slot, :, :n].to("cpu", copy=True) for v in self.cache.values],
            length=n,
        )
        self._release(request)

    def swap_in(self, request: LLMRequest) -> None:
        """Give a swapped-out request a free slot holding its cache positions again (no-op otherwise)."""
        swap = request.swapped
        if swap is None:
            return
        slot = self.cache.allocate()
        try:
            for cache, saved in zip(self.cache.keys + self.cache.values, swap.keys + swap.values, strict=True):
                cache[slot, :, : swap.length].copy_(saved)
        except Exception:
            self.cache.free(slot)
            raise
        self.cache._set_length(slot, swap.length)
        request.slot, request.swapped = slot, None

    def _sample(self, requests: Sequence[LLMRequest], hidden: torch.Tensor) -> list[StepOutput]:
        logp = self.model.speech_logp(hidden).cpu()  # [B, V], the step's one device->host copy
        return self._advance_all(requests, logp)

    def _advance_all(self, requests: Sequence[LLMRequest], logp: torch.Tensor) -> list[StepOutput]:
        """Sample every request from its row of the fp32 CPU log-probs [B, V]; free finished slots. Rows
        with the same sampling parameters are drawn together (``ras_sample_rows``: the same draws as
        ``ras_sample`` row by row, which takes the rest)."""
        stop_from = self.model.speech_token_size
        rows = [request._sampling_logp(row, stop_from) for request, row in zip(requests, logp, strict=True)]
        tokens = None
        if len(requests) > 1 and all(request.ras == requests[0].ras for request in requests):
            histories, generators = [r.out_tokens for r in requests], [r.generator for r in requests]
            tokens = ras_sample_rows(torch.stack(rows), histories, generators, requests[0].ras)
        if tokens is not None:
            steps = [request._accept(token, stop_from) for request, token in zip(requests, tokens, strict=True)]
        else:  # one request, differing parameters, or a NaN row: each drawn and taken in turn
            steps = [
                request._accept(ras_sample(row, request.out_tokens, request.generator, request.ras), stop_from)
                for request, row in zip(requests, rows, strict=True)
            ]
        outputs = []
        for request, out in zip(requests, steps, strict=True):
            if out.finished:
                self._release(request)
            outputs.append(out)
        return outputs

    def _release(self, request: LLMRequest) -> None:
        if request.slot is not None:
            self.cache.free(request.slot)
            request.slot = None


def generate(model: CosyVoice3LM, request: LLMRequest) -> Iterator[int]:
    """Yield the speech tokens of one request as they are sampled (stop id excluded)."""
    runner = LLMRunner(model, max_batch=1, max_len=request.num_cache_positions)
    out = runner.prefill([request])[0]
    while True:
        if out.token is not None:
            yield out.token
        if out.finished:
            return
        out = runner.decode_step([request])[0]
