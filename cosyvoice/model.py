"""CosyVoice3 as one object: load an official model directory, prepare voices, synthesise speech.

Single-request API::

    model = CosyVoice3.from_pretrained("Fun-CosyVoice3-0.5B-2512", device="cuda", dtype=torch.bfloat16)
    speaker = model.prepare_speaker(wave, 44100, "transcript of the prompt recording")  # SpeakerRecord
    speaker.save("voice.safetensors")                 # SpeakerRecord.load(...) later; no ONNX needed then
    for chunk in model.synthesize("Hello!", speaker, mode="zero_shot", stream=True, seed=0):
        ...                                           # 24 kHz float32 [n] CPU tensors

``synthesize`` normalises and splits the text (:mod:`cosyvoice.text.prompt`); each segment is one LLM request
(:class:`~cosyvoice.llm.LLMRunner`, batch 1, one torch.Generator per call seeded by ``seed``, shared by
the call's segments as upstream's global RNG is) feeding one :class:`~cosyvoice.token2wav.Token2WavStream`.
Streaming chunks follow the official hop schedule (25 + pad -> 50 -> 100 tokens, 3 look-ahead tokens, a
full-attention closing call); offline mode (``stream=False``) yields one chunk per segment. Validation
happens when ``synthesize`` is called; the returned iterator does the work lazily, and several iterators
can be stepped in any interleaving (each holds all of its own state).

Building blocks for a batched serving backend (which drives ``LLMRunner`` / ``Token2Wav.run`` itself):

* :meth:`CosyVoice3.text_segments` - text -> normalised segments (one LLM request each);
* :meth:`CosyVoice3.build_llm_prompt` - (segment, speaker, mode, instruct_text) -> ``LLMPrompt``;
* :meth:`CosyVoice3.new_llm_request` - ``LLMRequest`` with the model's RAS/length rules, its max_len capped
  so the audio fits the vocoder/flow noise buffers;
* :meth:`CosyVoice3.speaker_prompt` - ``SpeakerRecord`` -> ``SpeakerPrompt`` for ``Token2Wav.stream``;
* attributes ``config``, ``tokenizer``, ``llm`` (CosyVoice3LM), ``token2wav`` (Token2Wav), ``ras``,
  ``lengths``, ``campplus`` / ``speech_tokenizer`` (None when the ONNX file is absent).

Errors: :class:`ModelFilesError` for a missing or unusable model file (the message names the file and,
for checkpoints, the key); ``TextError`` / ``SpeakerError`` / ``LLMInputError`` for bad requests.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import torch

from cosyvoice.checkpoint import CheckpointError
from cosyvoice.config import ConfigError, CosyVoice3Config, load_config
from cosyvoice.flow import FlowError
from cosyvoice.frontend.onnx import CampPlus, OnnxModelError, SpeechTokenizerV3, default_providers
from cosyvoice.frontend.speaker import SpeakerError, SpeakerRecord
from cosyvoice.frontend.speaker import prepare_speaker as _prepare_speaker
from cosyvoice.hift import HiftError
from cosyvoice.llm import CosyVoice3LM, LLMPrompt, LLMRequest, LLMRunner, sampling_from_config
from cosyvoice.pretrained import load_llm
from cosyvoice.text.prompt import PromptMode, TextError, build_llm_text, prepare_tts_texts
from cosyvoice.text.tokenizer import CosyVoice3Tokenizer, TokenizerError
from cosyvoice.token2wav import SpeakerPrompt, Token2Wav

__all__ = ["CosyVoice3", "ModelFilesError"]

_LOAD_ERRORS = (CheckpointError, ConfigError, TokenizerError, FlowError, HiftError, OnnxModelError)


class ModelFilesError(RuntimeError):
    """A model file is missing, unreadable or does not fit the config; ``path`` names the file."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        super().__init__(message)
        self.path = None if path is None else Path(path)


def _required_files(config: CosyVoice3Config, llm_path: Path) -> list[Path]:
    blank_en = config.files.blank_en
    return [
        llm_path,
        config.files.flow,
        config.files.hift,
        blank_en / "vocab.json",
        blank_en / "merges.txt",
    ]


class CosyVoice3:
    """A loaded CosyVoice3 model (LLM, flow, HiFT, tokenizer, optional ONNX frontend); see module doc."""

    def __init__(
        self,
        *,
        config: CosyVoice3Config,
        tokenizer: CosyVoice3Tokenizer,
        llm: CosyVoice3LM,
        token2wav: Token2Wav,
        campplus: CampPlus | None = None,
        speech_tokenizer: SpeechTokenizerV3 | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.llm = llm
        self.token2wav = token2wav
        self.campplus = campplus
        self.speech_tokenizer = speech_tokenizer
        self.ras, self.lengths = sampling_from_config(config.sampling)
        self.sample_rate = config.sample_rate
        # Longest generation whose audio fits the vocoder's noise buffer (samples per token = 960).
        samples_per_token = config.hift.samples_per_frame * config.token_mel_ratio
        self.max_speech_tokens = token2wav.hift.m_source.max_samples // samples_per_token
        self.max_flow_tokens = token2wav.flow.decoder.max_frames // config.token_mel_ratio  # prompt included

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        use_rl_llm: bool = False,
        max_seconds: float | None = None,
    ) -> CosyVoice3:
        """Load ``model_dir`` as released. ``use_rl_llm`` reads ``llm.rl.pt`` instead of ``llm.pt``.

        ``dtype`` (float32 / float16 / bfloat16) applies to the LLM, flow and vocoder weights; the parts
        that need more precision keep it (f0 predictor float64, sampling, flow noise and vocoder source in
        float32). ``max_seconds`` bounds one segment's audio (the vocoder noise buffer; None keeps
        upstream's 300 s, about 260 MB). The ONNX frontend models load when present.
        """
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        if max_seconds is not None and not (isinstance(max_seconds, int | float) and 0 < max_seconds <= 300):
            raise ValueError(f"max_seconds must be None or in (0, 300], got {max_seconds!r}")
        device = torch.device(device)
        try:
            config = load_config(model_dir)
        except ConfigError as exc:
            raise ModelFilesError(str(exc)) from exc
        llm_path = config.files.llm_rl if use_rl_llm else config.files.llm
        if use_rl_llm and not llm_path.is_file():
            raise ModelFilesError(
                f"{llm_path}: use_rl_llm=True but this model has no {llm_path.name}", llm_path
            )
        missing = [path for path in _required_files(config, llm_path) if not path.is_file()]
        if missing:
            names = ", ".join(str(path) for path in missing)
            raise ModelFilesError(f"model file(s) not found: {names}", missing[0])
        try:
            tokenizer = CosyVoice3Tokenizer.from_dir(config.files.blank_en)
            llm = load_llm(config=config, use_rl_llm=use_rl_llm, device=device, dtype=dtype)
            token2wav = Token2Wav.from_pretrained(
                config.files.model_dir, config=config, device=device, dtype=dtype, max_seconds=max_seconds
            )
            campplus = speech_tokenizer = None
            if config.files.campplus.is_file():
                campplus = CampPlus(config.files.campplus)
            if config.files.speech_tokenizer.is_file():
                speech_tokenizer = SpeechTokenizerV3(
                    config.files.speech_tokenizer, providers=default_providers(device.type == "cuda")
                )
        except _LOAD_ERRORS as exc:
            raise ModelFilesError(str(exc), getattr(exc, "file", None)) from exc
        return cls(
            config=config,
            tokenizer=tokenizer,
            llm=llm,
            token2wav=token2wav,
            campplus=campplus,
            speech_tokenizer=speech_tokenizer,
        )

    # ----------------------------------------------------------------------------- voices

    def prepare_speaker(self, wave: torch.Tensor, sample_rate: int, transcript: str) -> SpeakerRecord:
        """Prompt recording (float [N] or [channels, N] in [-1, 1], >= 16 kHz, <= 30 s) + its transcript."""
        absent = [
            path
            for path, session in (
                (self.config.files.speech_tokenizer, self.speech_tokenizer),
                (self.config.files.campplus, self.campplus),
            )
            if session is None
        ]
        if absent:
            raise ModelFilesError(
                f"preparing a voice needs {', '.join(str(p) for p in absent)}, which this model directory "
                "lacks (synthesis with an already prepared SpeakerRecord still works)",
                absent[0],
            )
        if not isinstance(transcript, str) or not transcript.strip():
            raise SpeakerError("the prompt transcript must be a non-empty string")
        return _prepare_speaker(
            wave,
            sample_rate,
            transcript,
            tokenizer=self.tokenizer,
            speech_tokenizer=self.speech_tokenizer,
            speaker_encoder=self.campplus,
        )

    def speaker_prompt(self, record: SpeakerRecord) -> SpeakerPrompt:
        """The flow conditioning (prompt tokens, prompt mel, x-vector) of a speaker record, checked."""
        if not isinstance(record, SpeakerRecord):
            raise SpeakerError(f"speaker must be a SpeakerRecord, got {type(record).__name__}")
        flow = self.config.flow
        if record.embedding.shape[0] != flow.spk_embed_dim or record.prompt_mel.shape[1] != flow.mel_dim:
            raise SpeakerError(
                f"speaker record has a {record.embedding.shape[0]}-d embedding and {record.prompt_mel.shape[1]} "
                f"mel bins; this model needs {flow.spk_embed_dim} and {flow.mel_dim}"
            )
        tokens = record.prompt_speech_tokens
        if tokens.numel() and not bool(((tokens >= 0) & (tokens < flow.vocab_size)).all()):
            raise SpeakerError(f"speaker record has prompt speech tokens outside 0..{flow.vocab_size - 1}")
        return SpeakerPrompt(prompt_token=tokens, prompt_feat=record.prompt_mel, embedding=record.embedding)

    # ----------------------------------------------------------------------------- text -> requests

    def text_segments(self, text: str) -> list[str]:
        """Normalised tts-text segments (one LLM request each); texts with ``<|...|>`` stay whole."""
        if not isinstance(text, str):
            raise TextError(f"text must be a str, got {type(text).__name__}")
        segments = [s for s in prepare_tts_texts(text.strip(), self.tokenizer.encode) if s.strip()]
        if not segments:
            raise TextError(f"nothing to synthesise in {text!r}")
        return segments

    def build_llm_prompt(
        self,
        segment: str,
        speaker: SpeakerRecord,
        mode: str = "zero_shot",
        instruct_text: str | None = None,
    ) -> LLMPrompt:
        """One segment's LLM input: zero-shot uses the speaker's stored prompt text and speech tokens;
        cross-lingual puts the system prefix before the text; instruct uses ``instruct_text`` (not
        normalised; ``<|endofprompt|>`` is appended unless present)."""
        mode = _prompt_mode(mode)
        if mode is PromptMode.INSTRUCT and not (isinstance(instruct_text, str) and instruct_text.strip()):
            raise TextError("instruct mode needs a non-empty instruct_text")
        if mode is not PromptMode.INSTRUCT and instruct_text is not None:
            raise TextError(f"instruct_text is only used in instruct mode, not {mode.value}")
        if not isinstance(speaker, SpeakerRecord):
            raise SpeakerError(f"speaker must be a SpeakerRecord, got {type(speaker).__name__}")
        ids = build_llm_text(
            self.tokenizer, mode, segment, transcript=speaker.prompt_text, instruction=instruct_text
        )
        if mode is PromptMode.ZERO_SHOT:
            return LLMPrompt.zero_shot(ids.text_ids, speaker.prompt_text_tokens, speaker.prompt_speech_tokens)
        if mode is PromptMode.INSTRUCT:
            return LLMPrompt.instruct(ids.text_ids, ids.prompt_text_ids)
        return LLMPrompt.cross_lingual(ids.text_ids)

    def new_llm_request(
        self, prompt: LLMPrompt, *, generator: torch.Generator, num_prompt_tokens: int = 0
    ) -> LLMRequest:
        """An LLM request with the model's sampling rules; max_len also bounded so the segment's audio fits
        the vocoder buffer and prompt + speech fits the flow noise (``num_prompt_tokens``: flow prompt)."""
        request = LLMRequest(prompt, generator=generator, ras=self.ras, lengths=self.lengths)
        cap = min(self.max_speech_tokens, self.max_flow_tokens - num_prompt_tokens)
        if cap < 1:
            raise SpeakerError("the speaker prompt leaves no room for speech in the flow's noise buffer")
        request.max_len = min(request.max_len, cap)
        request.min_len = min(request.min_len, request.max_len)
        return request

    # ----------------------------------------------------------------------------- synthesis

    def synthesize(
        self,
        text: str,
        speaker: SpeakerRecord,
        *,
        mode: str = "zero_shot",
        instruct_text: str | None = None,
        stream: bool = True,
        seed: int | None = None,
    ) -> Iterator[torch.Tensor]:
        """Speech for ``text`` in ``speaker``'s voice: an iterator of 24 kHz float32 [n] CPU chunks.

        ``seed`` fixes the sampling (None: a random seed); the same seed gives the same speech tokens in
        streaming and offline mode.
        """
        mode = _prompt_mode(mode)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        flow_prompt = self.speaker_prompt(speaker)
        prompts = [
            self.build_llm_prompt(segment, speaker, mode, instruct_text)
            for segment in self.text_segments(text)
        ]
        generator = torch.Generator(device="cpu").manual_seed(secrets.randbits(62) if seed is None else seed)
        return self._run(prompts, flow_prompt, generator, bool(stream))

    def _run(
        self,
        prompts: list[LLMPrompt],
        flow_prompt: SpeakerPrompt,
        generator: torch.Generator,
        stream: bool,
    ) -> Iterator[torch.Tensor]:
        num_prompt = int(flow_prompt.prompt_token.shape[0])
        for prompt in prompts:
            request = self.new_llm_request(prompt, generator=generator, num_prompt_tokens=num_prompt)
            runner = LLMRunner(self.llm, max_batch=1, max_len=request.num_cache_positions)
            wave_stream = self.token2wav.stream(flow_prompt, stream=stream)
            try:
                out = runner.prefill([request])[0]
                while True:
                    if out.token is not None and out.to_flow:
                        yield from _host(wave_stream.push_tokens([out.token]))
                    if out.finished:
                        break
                    out = runner.decode_step([request])[0]
            finally:
                runner.abort(request)  # frees the slot if the consumer stopped early
            yield from _host(wave_stream.finish())


def _host(chunks: list[torch.Tensor]) -> list[torch.Tensor]:
    return [chunk.to("cpu", torch.float32) for chunk in chunks]


def _prompt_mode(mode: str) -> PromptMode:
    try:
        return PromptMode(mode)
    except ValueError as exc:
        choices = ", ".join(m.value for m in PromptMode)
        raise TextError(f"unknown mode {mode!r}; choose one of {choices}") from exc
