"""A prepared zero-shot speaker: everything CosyVoice3 needs from a prompt recording, saved once.

:func:`prepare_speaker` runs the official zero-shot frontend on one prompt recording: mono mix, each
consumer's copy resampled straight from the original rate (16 kHz for the speech tokenizer and
CAM++, 24 kHz for the flow mel), then the 24 kHz alignment rule: ``L = min(mel_frames // 2,
n_tokens)``, tokens cut to L and the mel to 2L frames (the LLM and the flow both use the cut tokens).
:class:`SpeakerRecord` stores the result with safetensors (no pickle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from cosyvoice.frontend.features import flow_mel
from cosyvoice.frontend.onnx import MAX_PROMPT_SECONDS
from cosyvoice.frontend.resample import resample
from cosyvoice.text.prompt import zero_shot_prompt

__all__ = ["MIN_PROMPT_SAMPLE_RATE", "SpeakerError", "SpeakerRecord", "prepare_speaker"]

MIN_PROMPT_SAMPLE_RATE = 16000
TOKEN_MEL_RATIO = 2
_FORMAT = "cosyvoice3-speaker/1"


class SpeakerError(ValueError):
    """A prompt recording or a speaker file cannot be used."""


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


class _SpeechTokenizer(Protocol):
    def tokenize_wave(self, wave16k: Tensor) -> Tensor: ...


class _SpeakerEncoder(Protocol):
    def embed_wave(self, wave16k: Tensor) -> Tensor: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeakerRecord:
    """Prompt features of one speaker, without batch dims, on the CPU.

    * ``prompt_text_tokens`` int32 ``[Lp]``: the zero-shot prompt_text ids
      (``"You are a helpful assistant.<|endofprompt|>" + transcript``);
    * ``prompt_speech_tokens`` int32 ``[L]``: speech tokens (LLM and flow prompt);
    * ``prompt_mel`` float32 ``[2L, 80]``: flow prompt mel, time-major;
    * ``embedding`` float32 ``[192]``: CAM++ x-vector (flow speaker condition);
    * ``prompt_text``: the transcript, for reference.
    """

    prompt_text_tokens: Tensor
    prompt_speech_tokens: Tensor
    prompt_mel: Tensor
    embedding: Tensor
    prompt_text: str = ""

    def __post_init__(self) -> None:
        def check(name: str, value: object, dtype: torch.dtype, dims: int) -> None:
            if not isinstance(value, Tensor) or value.dtype != dtype or value.dim() != dims:
                raise SpeakerError(f"{name} must be a {dims}-d {dtype} tensor")

        check("prompt_text_tokens", self.prompt_text_tokens, torch.int32, 1)
        check("prompt_speech_tokens", self.prompt_speech_tokens, torch.int32, 1)
        check("prompt_mel", self.prompt_mel, torch.float32, 2)
        check("embedding", self.embedding, torch.float32, 1)
        if self.prompt_mel.shape[0] != TOKEN_MEL_RATIO * self.prompt_speech_tokens.shape[0]:
            raise SpeakerError(
                f"prompt_mel has {self.prompt_mel.shape[0]} frames, expected "
                f"{TOKEN_MEL_RATIO} x {self.prompt_speech_tokens.shape[0]} speech tokens"
            )
        if not isinstance(self.prompt_text, str):
            raise SpeakerError("prompt_text must be a str")

    def save(self, path: str | Path) -> None:
        """Write the record as a safetensors file (tensors plus the transcript as metadata)."""
        tensors = {
            "prompt_text_tokens": self.prompt_text_tokens,
            "prompt_speech_tokens": self.prompt_speech_tokens,
            "prompt_mel": self.prompt_mel,
            "embedding": self.embedding,
        }
        tensors = {name: value.detach().to("cpu").contiguous() for name, value in tensors.items()}
        save_file(tensors, str(path), metadata={"format": _FORMAT, "prompt_text": self.prompt_text})

    @classmethod
    def load(cls, path: str | Path) -> SpeakerRecord:
        """Read a record written by :meth:`save`; raise SpeakerError naming the file on any problem."""
        path = Path(path)
        if not path.is_file():
            raise SpeakerError(f"{path}: speaker file not found")
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = dict(handle.metadata() or {})
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        except (SafetensorError, OSError, ValueError) as exc:
            raise SpeakerError(f"{path}: not a readable speaker file: {exc}") from exc
        if metadata.get("format") != _FORMAT:
            raise SpeakerError(f"{path}: not a {_FORMAT} file")
        names = {"prompt_text_tokens", "prompt_speech_tokens", "prompt_mel", "embedding"}
        if set(tensors) != names:
            raise SpeakerError(f"{path}: expected tensors {sorted(names)}, found {sorted(tensors)}")
        try:
            return cls(**tensors, prompt_text=metadata.get("prompt_text", ""))
        except SpeakerError as exc:
            raise SpeakerError(f"{path}: {exc}") from exc


def _mono(wave: Tensor) -> Tensor:
    """``[N]`` or ``[C, N]`` float audio -> mono ``[1, N]`` float32 (channel mean)."""
    if not isinstance(wave, Tensor) or not wave.is_floating_point() or wave.dim() not in (1, 2):
        raise SpeakerError("prompt audio must be a float tensor [N] or [channels, N]")
    wave = wave.detach().to(torch.float32)
    return wave[None] if wave.dim() == 1 else wave.mean(dim=0, keepdim=True)  # [1, N]


def prepare_speaker(
    wave: Tensor,
    sample_rate: int,
    transcript: str,
    *,
    tokenizer: _Encoder,
    speech_tokenizer: _SpeechTokenizer,
    speaker_encoder: _SpeakerEncoder,
) -> SpeakerRecord:
    """Prompt recording (float in [-1, 1], any rate >= 16 kHz, at most 30 s) -> :class:`SpeakerRecord`.

    ``speech_tokenizer`` is a :class:`~cosyvoice.frontend.onnx.SpeechTokenizerV3`, ``speaker_encoder``
    a :class:`~cosyvoice.frontend.onnx.CampPlus` (or anything with the same methods).
    """
    if not isinstance(sample_rate, int) or sample_rate < MIN_PROMPT_SAMPLE_RATE:
        raise SpeakerError(
            f"prompt sample rate must be an integer >= {MIN_PROMPT_SAMPLE_RATE}, got {sample_rate}"
        )
    mono = _mono(wave)
    wave16k = resample(mono, sample_rate, 16000)  # [1, N16]
    if wave16k.shape[1] / 16000 > MAX_PROMPT_SECONDS:
        raise SpeakerError(
            f"prompt audio is {wave16k.shape[1] / 16000:.2f} s, the limit is {MAX_PROMPT_SECONDS:g} s"
        )
    if wave16k.shape[1] < 16000 // 10:
        raise SpeakerError("prompt audio is shorter than 0.1 s")
    wave24k = resample(mono, sample_rate, 24000)  # [1, N24], from the original rate, not from 16 kHz
    tokens = speech_tokenizer.tokenize_wave(wave16k).reshape(-1).to("cpu", torch.int32)  # [T_tok]
    embedding = speaker_encoder.embed_wave(wave16k).reshape(-1).to("cpu", torch.float32)  # [192]
    mel = flow_mel(wave24k)[0].to("cpu")  # [T_mel, 80]
    length = min(mel.shape[0] // TOKEN_MEL_RATIO, tokens.shape[0])
    if length == 0:
        raise SpeakerError("prompt audio yields no speech tokens")
    text_ids = torch.tensor(tokenizer.encode(zero_shot_prompt(transcript)), dtype=torch.int32)
    return SpeakerRecord(
        prompt_text_tokens=text_ids,
        prompt_speech_tokens=tokens[:length].contiguous(),
        prompt_mel=mel[: TOKEN_MEL_RATIO * length].contiguous(),
        embedding=embedding,
        prompt_text=transcript,
    )
