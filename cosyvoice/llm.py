"""CosyVoice3 speech-token LM: Qwen2 backbone, speech embedding/head, prompt assembly and a
batched generation API for a serving scheduler.

Speech vocabulary: ids 0..6560 are FSQ speech codes, 6561.. are 200 special rows
(sos 6561, eos 6562, task_id 6563, fill 6564, the rest unused). Sampling any id >= 6561 ends a
request; such ids are never emitted. The LLM input is
``[sos, embed_tokens(prompt_text ++ text), task_id, speech_embedding(prompt_speech)]``.

Generation follows the reference decode loop, including its quirk: before ``min_len`` only
id 6561 (sos) is masked, so eos and the other stop ids can still end a request early.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from cosyvoice.checkpoint import check_keys, check_shapes, load_state_dict
from cosyvoice.config import ConfigError, CosyVoice3Config, LLMConfig, SamplingConfig, load_config
from cosyvoice.qwen2 import KVCache, Qwen2Config, Qwen2Model
from cosyvoice.sampling import RasParams, SilentTokenFilter, make_generator, ras_sample

SPEECH_TOKEN_SIZE = 6561
NUM_SPECIAL_SPEECH_IDS = 200
SOS_ID = SPEECH_TOKEN_SIZE  # 6561
EOS_ID = SPEECH_TOKEN_SIZE + 1  # 6562
TASK_ID = SPEECH_TOKEN_SIZE + 2  # 6563
FILL_ID = SPEECH_TOKEN_SIZE + 3  # 6564
END_OF_PROMPT_TEXT_ID = 151646  # <|endofprompt|>, must occur in prompt_text ++ text
QWEN_PREFIX = "llm.model.model."
IGNORED_KEYS = ("llm.model.lm_head.weight",)  # tied text head, never used


class LLMInputError(ValueError):
    """A prompt or request the LLM cannot take."""


def _checkpoint_key(module_key: str) -> str:
    """Our ``model.*`` (Hugging Face Qwen2ForCausalLM naming) -> the release's ``llm.model.model.*``."""
    return QWEN_PREFIX + module_key.removeprefix("model.") if module_key.startswith("model.") else module_key


def _module_key(checkpoint_key: str) -> str:
    if checkpoint_key.startswith(QWEN_PREFIX):
        return "model." + checkpoint_key.removeprefix(QWEN_PREFIX)
    return checkpoint_key


def qwen2_config(llm: LLMConfig) -> Qwen2Config:
    """The backbone geometry of a parsed model config."""
    if llm.head_dim * llm.num_attention_heads != llm.hidden_size:
        raise ConfigError(
            f"head_dim {llm.head_dim} x {llm.num_attention_heads} heads != hidden {llm.hidden_size}"
        )
    return Qwen2Config(
        hidden_size=llm.hidden_size,
        intermediate_size=llm.intermediate_size,
        num_hidden_layers=llm.num_layers,
        num_attention_heads=llm.num_attention_heads,
        num_key_value_heads=llm.num_key_value_heads,
        vocab_size=llm.text_vocab_size,
        rms_norm_eps=llm.rms_norm_eps,
        rope_theta=llm.rope_theta,
        max_position_embeddings=llm.max_position_embeddings,
    )


def _as_ids(ids: Sequence[int] | torch.Tensor, name: str) -> torch.Tensor:
    """1-D int64 CPU ids from a sequence of ints or an integer tensor [L] / [1, L]."""
    if not isinstance(ids, torch.Tensor):
        try:
            ids = torch.tensor([operator.index(v) for v in ids], dtype=torch.int64)
        except TypeError as exc:
            raise LLMInputError(f"{name} must be a sequence of integer ids") from exc
    t = ids.detach().to("cpu")
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.is_floating_point() or t.is_complex():
        raise LLMInputError(f"{name} must be a 1-D integer id sequence, got {tuple(t.shape)} {t.dtype}")
    return t.to(torch.int64)


@dataclasses.dataclass(frozen=True, slots=True)
class LLMPrompt:
    """Token-level LLM input of one request (1-D int64 CPU tensors)."""

    text: torch.Tensor  # tts text ids; its length sets min/max length
    prompt_text: torch.Tensor  # ids before the text (transcript or instruction), may be empty
    prompt_speech: torch.Tensor  # prompt speech tokens (< 6561), may be empty

    @classmethod
    def create(
        cls,
        text: Sequence[int] | torch.Tensor,
        prompt_text: Sequence[int] | torch.Tensor = (),
        prompt_speech: Sequence[int] | torch.Tensor = (),
    ) -> LLMPrompt:
        text_ids = _as_ids(text, "text")
        prompt_ids = _as_ids(prompt_text, "prompt_text")
        speech = _as_ids(prompt_speech, "prompt_speech")
        if text_ids.numel() == 0:
            raise LLMInputError("text must not be empty")
        if not bool((text_ids == END_OF_PROMPT_TEXT_ID).any() | (prompt_ids == END_OF_PROMPT_TEXT_ID).any()):
            raise LLMInputError(f"<|endofprompt|> ({END_OF_PROMPT_TEXT_ID}) missing from prompt_text + text")
        if bool((text_ids < 0).any() | (prompt_ids < 0).any()):
            raise LLMInputError("text ids must be non-negative")
        if speech.numel() and not bool(((speech >= 0) & (speech < SPEECH_TOKEN_SIZE)).all()):
            raise LLMInputError(f"prompt speech tokens must lie in 0..{SPEECH_TOKEN_SIZE - 1}")
        return cls(text_ids, prompt_ids, speech)

    @classmethod
    def zero_shot(cls, text, prompt_text, prompt_speech) -> LLMPrompt:
        """prompt_text = "You are a helpful assistant.<|endofprompt|>" + transcript ids."""
        return cls.create(text, prompt_text, prompt_speech)

    @classmethod
    def cross_lingual(cls, text) -> LLMPrompt:
        """The text itself starts with the "...<|endofprompt|>" system prefix; no prompt speech."""
        return cls.create(text)

    @classmethod
    def instruct(cls, text, instruct_text) -> LLMPrompt:
        """instruct_text ends with <|endofprompt|>; no prompt speech."""
        return cls.create(text, instruct_text)


class CosyVoice3LM(nn.Module):
    def __init__(self, config: Qwen2Config, speech_token_size: int = SPEECH_TOKEN_SIZE) -> None:
        super().__init__()
        self.speech_token_size = speech_token_size
        num_rows = speech_token_size + NUM_SPECIAL_SPEECH_IDS
        self.model = Qwen2Model(config)  # HF name of the decoder inside Qwen2ForCausalLM
        self.speech_embedding = nn.Embedding(num_rows, config.hidden_size)
        self.llm_decoder = nn.Linear(config.hidden_size, num_rows, bias=False)

    @property
    def config(self) -> Qwen2Config:
        return self.model.config

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        config: CosyVoice3Config | None = None,
    ) -> CosyVoice3LM:
        """Geometry from the model directory's config, weights from its ``llm.pt``."""
        config = load_config(model_dir) if config is None else config
        model = cls(qwen2_config(config.llm), speech_token_size=config.llm.speech_token_size)
        model.load_checkpoint(config.files.llm)
        return model.to(device=device, dtype=dtype).eval()

    def load_checkpoint(self, path: str | Path) -> None:
        """Load an official ``llm.pt``; errors name the file and the checkpoint's own key names."""
        raw = load_state_dict(path)
        wanted = {key: value for key, value in raw.items() if key not in IGNORED_KEYS}
        own_shapes = {_checkpoint_key(key): tuple(value.shape) for key, value in self.state_dict().items()}
        check_keys(own_shapes.keys(), wanted, path)
        check_shapes(own_shapes, wanted, path)
        renamed = {_module_key(key): value for key, value in wanted.items()}
        self.load_state_dict(renamed, strict=True)

    def embed_prompt(self, prompt: LLMPrompt) -> torch.Tensor:
        """The prefix embedding sequence [L, H] of one request."""
        device = self.speech_embedding.weight.device
        text = torch.cat([prompt.prompt_text, prompt.text])  # [Lp + Lt]
        if int(text.max()) >= self.config.vocab_size:
            raise LLMInputError(f"text id {int(text.max())} >= vocab size {self.config.vocab_size}")
        speech_rows = self.speech_embedding.weight
        sos, task_id = self.speech_token_size, self.speech_token_size + 2
        return torch.cat(
            [
                speech_rows[sos][None],  # [1, H]
                self.model.embed_tokens(text.to(device)),  # [Lp + Lt, H]
                speech_rows[task_id][None],  # [1, H]
                self.speech_embedding(prompt.prompt_speech.to(device)),  # [Ls, H]
            ]
        )

    def speech_logp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the 6761 speech rows, fp32: hidden [..., H] -> [..., 6761]."""
        return self.llm_decoder(hidden).float().log_softmax(dim=-1)

    def new_cache(self, *, max_batch: int, max_len: int, reserved_slots: int = 0) -> KVCache:
        return self.model.new_cache(max_batch=max_batch, max_len=max_len, reserved_slots=reserved_slots)

    @torch.inference_mode()
    def forward_logp(self, prompt: LLMPrompt, targets: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Teacher-forced log-probs [T + 1, 6761] along the KV-cached decode path: row 0 after
        the prefix, row i after feeding ``targets[i - 1]``."""
        target_ids = _as_ids(targets, "targets")
        if target_ids.numel() and not bool(
            ((target_ids >= 0) & (target_ids < self.speech_embedding.num_embeddings)).all()
        ):
            raise LLMInputError("target speech tokens out of range")
        prefix = self.embed_prompt(prompt)  # [L, H]
        cache = self.new_cache(max_batch=1, max_len=prefix.shape[0] + target_ids.numel())
        slot = cache.allocate()
        hidden = self.model(prefix[None], cache, [slot])  # [1, L, H]
        rows = [self.speech_logp(hidden[0, -1])]
        step_embeds = self.speech_embedding(target_ids.to(prefix.device))  # [T, H]
        for i in range(target_ids.numel()):
            hidden = self.model(step_embeds[i][None, None], cache, [slot])  # [1, 1, H]
            rows.append(self.speech_logp(hidden[0, -1]))
        return torch.stack(rows)  # [T + 1, 6761]


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

    def _advance(self, logp: torch.Tensor, stop_from: int) -> StepOutput:
        """One sampling step on this request's fp32 CPU log-probs [V]."""
        if len(self.out_tokens) < self.min_len:
            logp = logp.clone()
            if self.lengths.mask_all_stops_before_min:
                logp[stop_from:] = -float("inf")
            else:
                logp[stop_from] = -float("inf")  # the reference masks only this id (sos)
        token = ras_sample(logp, self.out_tokens, self.generator, self.ras)
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
        self._release(request)

    def _sample(self, requests: Sequence[LLMRequest], hidden: torch.Tensor) -> list[StepOutput]:
        logp = self.model.speech_logp(hidden).cpu()  # [B, V], the step's one device->host copy
        return self._advance_all(requests, logp)

    def _advance_all(self, requests: Sequence[LLMRequest], logp: torch.Tensor) -> list[StepOutput]:
        """Sample every request from its row of the fp32 CPU log-probs [B, V]; free finished slots."""
        outputs = []
        for request, row in zip(requests, logp, strict=True):
            out = request._advance(row, self.model.speech_token_size)
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
