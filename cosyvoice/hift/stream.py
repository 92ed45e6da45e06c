"""Per-request streaming vocoder state (the official v3 scheme), optionally re-vocoding a bounded window.

Upstream appends each new mel chunk to the request's mel, re-vocodes the *whole* accumulated mel
(``finalize=False`` except at the end) and emits the samples past those already sent; a non-final call on
T frames yields ``S * (T - 8)`` samples. Because the vocoder is causal, the same samples come out of a
window that starts ``context_frames`` before the first frame still to emit, provided the window resumes
the running phase sum and the noise-buffer index of a whole-utterance run
(:meth:`CausalHift.left_context_frames`, 42 frames = 0.84 s for the release). ``context_frames=None``
keeps upstream's O(N) re-vocoding per hop; a window bounds it (and the mel kept) to O(hop + context).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cosyvoice.hift.errors import HiftInputError
from cosyvoice.hift.generator import CausalHift
from cosyvoice.hift.source import PhaseResume

__all__ = ["HiftStreamState", "vocode_streams"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Window:
    mel: torch.Tensor  # [C, W] mel frames start .. total - 1
    start: int  # absolute frame of the window's first frame
    finalize: bool
    resume_frame: int  # window frame where the running phase sum restarts (0 = start of utterance)
    resume_value: torch.Tensor  # [H] float64 running sum before that frame


class HiftStreamState:
    """Accumulated mel and emitted-sample count of one request (never shared between requests)."""

    def __init__(self, hift: CausalHift, *, context_frames: int | None = None) -> None:
        if context_frames is not None and context_frames < hift.left_context_frames():
            raise HiftInputError(
                f"context_frames {context_frames} < the vocoder's left receptive field "
                f"{hift.left_context_frames()}: windows would change the output"
            )
        self.samples_per_frame = hift.samples_per_frame
        self.f0_context = hift.f0_context_frames
        self.context_frames = context_frames
        self.num_harmonics = hift.config.nb_harmonics + 1
        self.mel: torch.Tensor | None = None  # [C, frames mel_start ..]
        self.mel_start = 0  # absolute frame index of self.mel[:, 0]
        self.speech_offset = 0  # samples emitted so far (a multiple of samples_per_frame)
        self.phase_frame = 0  # absolute frame where the next window restarts the phase sum
        device = hift.conv_pre.weight.device
        self.phase_value = torch.zeros(self.num_harmonics, dtype=torch.float64, device=device)  # [H]
        self.finished = False

    @property
    def total_frames(self) -> int:
        return self.mel_start + (0 if self.mel is None else self.mel.shape[1])

    def append(self, mel: torch.Tensor) -> None:
        """Add mel frames [C, m] (or [1, C, m]) after those already held."""
        self.mel = self._joined(mel)

    def _joined(self, mel: torch.Tensor) -> torch.Tensor:
        """The mel held with ``mel`` [C, m] (or [1, C, m]) after it: [C, T] (the state unchanged)."""
        if self.finished:
            raise HiftInputError("mel appended after the final vocoder call")
        mel = mel[0] if mel.dim() == 3 else mel  # [C, m]
        return mel if self.mel is None else torch.cat([self.mel, mel.to(self.mel)], dim=1)  # [C, T]

    def _window(self, finalize: bool, extra: torch.Tensor | None = None) -> _Window:
        """The window to vocode next; ``extra``: mel frames [C, m] taken as appended (they are not yet)."""
        held = self.mel if extra is None else self._joined(extra)
        if held is None:
            raise HiftInputError("no mel to vocode")
        emitted = self.speech_offset // self.samples_per_frame
        start = 0
        if self.context_frames is not None:
            start = max(0, emitted - self.context_frames)
        if start > 0 and start + self.f0_context != self.phase_frame:
            raise HiftInputError("stream phase state does not match its window (state corrupted)")
        resume_frame = self.f0_context if start > 0 else 0
        value = self.phase_value if start > 0 else torch.zeros_like(self.phase_value)
        mel = held[:, start - self.mel_start :]  # [C, total - start]
        return _Window(mel=mel, start=start, finalize=finalize, resume_frame=resume_frame, resume_value=value)

    def _commit(
        self, window: _Window, speech: torch.Tensor, speech_len: int, running: torch.Tensor
    ) -> torch.Tensor:
        """Take row results (speech [L], running [T, H]); returns the new samples and updates the state."""
        spf = self.samples_per_frame
        first = self.speech_offset - spf * window.start
        chunk = speech[first:speech_len]  # [n]
        self.speech_offset = spf * window.start + max(first, speech_len)
        if window.finalize:
            self.finished = True
            return chunk
        if self.context_frames is not None:
            next_start = self.speech_offset // spf - self.context_frames
            if next_start > 0:
                self.phase_frame = next_start + self.f0_context
                self.phase_value = running[self.phase_frame - 1 - window.start].clone()
                self.mel = self.mel[:, next_start - self.mel_start :]  # keep only what windows still need
                self.mel_start = next_start
        return chunk

    def vocode_pieces(
        self, hift: CausalHift, mel: torch.Tensor, *, finalize: bool
    ) -> Generator[None, None, torch.Tensor]:
        """``append(mel)`` then ``vocode_streams(hift, [self], [finalize])`` a piece at a time: a generator
        that yields between the vocoder's pieces (:meth:`CausalHift.pieces`) and returns the new samples
        [n]. The state changes only at the end (a generator dropped before it leaves the state as it
        was); the same samples as the call. Run each piece under ``torch.inference_mode``."""
        window = self._window(bool(finalize), extra=mel)
        mel_in, args = _vocoder_input(hift, [window])
        out = yield from hift.pieces(mel_in, **args)
        self.append(mel)
        return self._commit(window, out.speech[0], out.speech_lens[0], out.phase_running[0])

    def push(self, hift: CausalHift, mel: torch.Tensor, *, finalize: bool) -> torch.Tensor:
        """Append mel [C, m] and vocode this request alone; returns the new samples [n]."""
        self.append(mel)
        return vocode_streams(hift, [self], [finalize])[0]


def vocode_streams(
    hift: CausalHift, states: Sequence[HiftStreamState], finalize: Sequence[bool]
) -> list[torch.Tensor]:
    """One batched vocoder call over several requests' windows; returns each request's new samples."""
    if len(states) != len(finalize) or not states:
        raise HiftInputError("need one finalize flag per stream state, at least one state")
    if len({id(s) for s in states}) != len(states):
        raise HiftInputError("a stream state appears twice in one vocoder batch")
    windows = [state._window(bool(f)) for state, f in zip(states, finalize, strict=True)]
    mel, args = _vocoder_input(hift, windows)
    with torch.inference_mode():
        out = hift(mel, **args)
    return [
        state._commit(window, out.speech[b], out.speech_lens[b], out.phase_running[b])
        for b, (state, window) in enumerate(zip(states, windows, strict=True))
    ]


def _vocoder_input(hift: CausalHift, windows: Sequence[_Window]) -> tuple[torch.Tensor, dict[str, Any]]:
    """The windows as one vocoder batch: mel [B, C, T] on the vocoder's device (rows zero-padded) and the
    other arguments of :meth:`CausalHift.forward` / :meth:`CausalHift.pieces`."""
    lens = [int(w.mel.shape[1]) for w in windows]
    mel = windows[0].mel.new_zeros(len(windows), windows[0].mel.shape[0], max(lens))  # [B, C, T]
    for b, window in enumerate(windows):
        mel[b, :, : lens[b]] = window.mel
    device = hift.conv_pre.weight.device
    resume = PhaseResume(
        values=torch.stack([w.resume_value for w in windows]).to(device),  # [B, H]
        frames=[w.resume_frame for w in windows],
    )
    return mel.to(device), {
        "mel_lens": lens,
        "finalize": [w.finalize for w in windows],
        "sample_offsets": [hift.samples_per_frame * w.start for w in windows],
        "phase_resume": resume,
    }
