"""The causal HiFT vocoder of CosyVoice3 (upstream ``CausalHiFTGenerator``), batched with per-row lengths.

mel [B, 80, T] -> f0 (float64 predictor) -> NSF excitation -> STFT -> decoder (conv_pre with look-ahead,
upsampling stages fused with the downsampled source spectrum, averaged resblocks) -> magnitude/phase ->
iSTFT -> clamp. Every conv is causal except the two look-ahead convs (f0 ``condnet[0]``, 3 frames;
``conv_pre``, 4 frames), so a row's output is a prefix-stable function of its mel.

``finalize=True`` (end of utterance) zero-pads the look-ahead and yields ``S * T`` samples.
``finalize=False`` uses the last 3 frames as f0 look-ahead, the 4 before them as conv_pre look-ahead, and
drops one more frame of samples: ``S * (T - 8)`` samples, all equal to the start of a later, longer call.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cosyvoice.hift.buffers import HiftNoiseBuffers
from cosyvoice.hift.config import HiFTConfig
from cosyvoice.hift.errors import HiftInputError
from cosyvoice.hift.f0 import F0Predictor
from cosyvoice.hift.layers import CausalConv1d, DownsampleConv1d, ResBlock, UpsampleConv1d
from cosyvoice.hift.source import PhaseResume, SourceModule
from cosyvoice.hift.stft import SpectralCodec

__all__ = ["CausalHift", "HiftOutput"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HiftOutput:
    speech: torch.Tensor  # [B, L] float32, row i valid up to speech_lens[i]
    speech_lens: list[int]
    source: torch.Tensor  # [B, 1, Ls] float32 NSF excitation, row i valid up to source_lens[i]
    source_lens: list[int]
    phase_running: torch.Tensor  # [B, T, H] float64 running rad sum per mel frame (to resume a window)


def _resblock_reach(block: ResBlock) -> int:
    return sum(c1.padding + c2.padding for c1, c2 in zip(block.convs1, block.convs2, strict=True))


class CausalHift(nn.Module):
    """The vocoder; parameter names follow ``hift.pt`` after weight-norm folding (see loading.py).

    ``buffers`` are the fixed noise buffers (:func:`cosyvoice.pretrained.official_hift_buffers` for a release
    model). The module holds no per-request state: streaming state lives in
    :class:`cosyvoice.hift.HiftStreamState`.
    """

    def __init__(self, config: HiFTConfig, buffers: HiftNoiseBuffers) -> None:
        super().__init__()
        self.config = config
        self.samples_per_frame = config.samples_per_frame
        self.m_source = SourceModule(
            num_harmonics=config.nb_harmonics + 1,
            sampling_rate=config.sampling_rate,
            samples_per_frame=self.samples_per_frame,
            sine_amp=config.nsf_alpha,
            noise_std=config.nsf_sigma,
            voiced_threshold=config.nsf_voiced_threshold,
            buffers=buffers,
        )
        self.f0_predictor = F0Predictor(config.f0_in_channels, config.f0_cond_channels, config.f0_num_class)
        base = config.base_channels
        self.conv_pre = CausalConv1d(config.in_channels, base, config.conv_pre_look_right + 1, side="right")
        rates = config.upsample_rates
        self.ups = nn.ModuleList(
            UpsampleConv1d(base // 2**i, base // 2 ** (i + 1), k, u)
            for i, (u, k) in enumerate(zip(rates, config.upsample_kernel_sizes, strict=True))
        )
        spec_channels = config.istft_n_fft + 2
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (k, dilations) in enumerate(
            zip(config.source_resblock_kernel_sizes, config.source_resblock_dilation_sizes, strict=True)
        ):
            channels = base // 2 ** (i + 1)
            rate = 1
            for later in rates[i + 1 :]:
                rate *= later  # STFT frames per stage-i frame
            down = (
                CausalConv1d(spec_channels, channels, 1)
                if rate == 1
                else DownsampleConv1d(spec_channels, channels, rate)
            )
            self.source_downs.append(down)
            self.source_resblocks.append(ResBlock(channels, k, tuple(dilations)))
        self.num_kernels = len(config.resblock_kernel_sizes)
        self.resblocks = nn.ModuleList(
            ResBlock(base // 2 ** (i + 1), k, tuple(d))
            for i in range(len(rates))
            for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True)
        )
        self.conv_post = CausalConv1d(base // 2 ** len(rates), spec_channels, 7)
        self.spectral = SpectralCodec(config.istft_n_fft, config.istft_hop_len)
        self.look_ahead_frames = F0Predictor.look_ahead + config.conv_pre_look_right + 1  # withheld (8)

    @property
    def f0_context_frames(self) -> int:
        """Left receptive field of the f0 predictor in frames (8): f0 is exact after that much context."""
        left_convs = list(self.f0_predictor.condnet)[1:]  # condnet[0] looks right, the others left
        return sum(conv.padding for conv in left_convs if isinstance(conv, CausalConv1d))

    def left_context_frames(self) -> int:
        """Mel frames of left context after which a window's output equals a whole-utterance run.

        A conservative sum of every left reach (f0, source branch, upsampling convs, resblocks, conv_post,
        STFT/iSTFT halves), rounded up: 42 for the release kernels. Output frames that far into a window
        see exactly the inputs a full run sees (given the resumed phase and noise offset).
        """
        cfg = self.config
        reach = float(self.f0_context_frames)
        rate = 1
        hop_frames = self.samples_per_frame // cfg.istft_hop_len
        for i, up in enumerate(self.ups):
            rate *= up.rate
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            samples = up.padding + 1 + max(_resblock_reach(b) for b in blocks)
            samples += _resblock_reach(self.source_resblocks[i])
            down = self.source_downs[i]
            spec_frames = down.rate - 1 if isinstance(down, DownsampleConv1d) else 0
            reach += samples / rate + spec_frames / hop_frames
        reach += self.conv_post.padding / rate + 2 * cfg.istft_n_fft / self.samples_per_frame
        return int(reach) + 1

    @property
    def dtype(self) -> torch.dtype:
        return self.conv_pre.weight.dtype

    def _decode(
        self, mel: torch.Tensor, source: torch.Tensor, source_lens: list[int], spec_frames: list[int]
    ) -> Generator[None, None, torch.Tensor]:
        """mel [B, C, T], source [B, 1, S*T] -> waveform [B, S*T] before the clamp, a piece at a time."""
        spec = self.spectral.stft(source[:, 0], source_lens).to(self.dtype)  # [B, n_fft + 2, S*T/hop + 1]
        magnitude, phase = yield from self._decode_pieces(mel, spec)  # each [B, bins, S*T/hop + 1]
        return self.spectral.istft(magnitude, phase, spec_frames)  # [B, S*T]

    def decode_spectrum(self, mel: torch.Tensor, spec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder network: mel [B, C, T] and the source spectrum [B, n_fft + 2, F = S*T/hop + 1] ->
        (magnitude, phase), each [B, n_fft // 2 + 1, F].

        Pure tensor code with no per-row lengths and no host syncs (the ``torch.compile`` target of
        :mod:`cosyvoice.token2wav.compile`). Every conv but ``conv_pre`` is causal and ``conv_pre`` looks
        ahead into zero padding, so zero frames appended on the right leave the first F output frames
        unchanged. :meth:`_decode_pieces` runs the same operations a piece at a time.
        """
        x = self.conv_pre(mel.to(self.dtype))  # [B, base, T]
        for i in range(len(self.ups)):
            x = self._stage_input(i, x, spec)
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            acc = blocks[0](x)
            for block in blocks[1:]:
                acc = acc + block(x)
            x = acc / self.num_kernels
        return self._spectrum(x)

    def _stage_input(self, i: int, x: torch.Tensor, spec: torch.Tensor) -> torch.Tensor:
        """Upsampling stage ``i``'s input to its resblocks: x upsampled, fused with the source spectrum."""
        x = self.ups[i](F.leaky_relu(x, self.config.lrelu_slope))  # [B, ch_i, T * prod(rates[:i+1])]
        if i == len(self.ups) - 1:
            x = F.pad(x, (1, 0), mode="reflect")  # [B, ch, S*T/hop + 1]
        return x + self.source_resblocks[i](self.source_downs[i](spec))

    def _spectrum(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last stage's output [B, ch, F] -> (magnitude, phase), each [B, n_fft // 2 + 1, F]."""
        x = self.conv_post(F.leaky_relu(x))  # [B, n_fft + 2, F]  (default slope 0.01 here)
        bins = self.config.istft_n_fft // 2 + 1
        magnitude = torch.exp(x[:, :bins])  # [B, bins, F]
        phase = torch.sin(x[:, bins:])  # [B, bins, F]  (sin as upstream: the phase goes through trig twice)
        return magnitude, phase

    def _decode_pieces(
        self, mel: torch.Tensor, spec: torch.Tensor
    ) -> Generator[None, None, tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`decode_spectrum`, its operations in the same order, yielding after each resblock (a
        few ms each on a CPU; a caller may run other work between two pieces). A compiled
        ``decode_spectrum`` (an instance attribute, :mod:`cosyvoice.token2wav.compile`) runs whole."""
        if "decode_spectrum" in vars(self):
            return self.decode_spectrum(mel, spec)
        x = self.conv_pre(mel.to(self.dtype))
        for i in range(len(self.ups)):
            x = self._stage_input(i, x, spec)
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            acc = blocks[0](x)
            for block in blocks[1:]:
                yield
                acc = acc + block(x)
            x = acc / self.num_kernels
            yield
        return self._spectrum(x)

    def _check(self, mel: torch.Tensor, mel_lens: Sequence[int] | None, finals: list[bool]) -> list[int]:
        if mel.dim() != 3 or mel.shape[1] != self.config.in_channels or not mel.is_floating_point():
            raise HiftInputError(
                f"mel must be float [B, {self.config.in_channels}, T], got {tuple(mel.shape)} {mel.dtype}"
            )
        batch, _, total = mel.shape
        lens = [total] * batch if mel_lens is None else [int(n) for n in mel_lens]
        if len(lens) != batch or len(finals) != batch:
            raise HiftInputError(f"need one length and one finalize flag per row ({batch} rows)")
        for n, final in zip(lens, finals, strict=True):
            minimum = 1 if final else self.look_ahead_frames
            if not minimum <= n <= total:
                raise HiftInputError(
                    f"row length {n} outside {minimum}..{total} (finalize={final}, padded length {total})"
                )
        return lens

    def forward(
        self,
        mel: torch.Tensor,
        mel_lens: Sequence[int] | None = None,
        finalize: bool | Sequence[bool] = True,
        *,
        sample_offsets: Sequence[int] | None = None,
        phase_resume: PhaseResume | None = None,
    ) -> HiftOutput:
        """Vocode mel [B, C, T] (row i: its first ``mel_lens[i]`` frames, per-row ``finalize``).

        ``sample_offsets`` / ``phase_resume`` let a row start mid-utterance (window re-vocoding): the
        noise-buffer index of the window's first sample and where to restart the running rad sum.
        """
        pieces = self.pieces(mel, mel_lens, finalize, sample_offsets=sample_offsets, phase_resume=phase_resume)
        while True:
            try:
                next(pieces)
            except StopIteration as end:
                return end.value

    def pieces(
        self,
        mel: torch.Tensor,
        mel_lens: Sequence[int] | None = None,
        finalize: bool | Sequence[bool] = True,
        *,
        sample_offsets: Sequence[int] | None = None,
        phase_resume: PhaseResume | None = None,
    ) -> Generator[None, None, HiftOutput]:
        """:meth:`forward` a piece at a time: a generator that yields between the decoder's resblocks (its
        input checked at the first ``next``) and returns the :class:`HiftOutput`. The same operations in
        the same order as a call, so the same samples however long the caller waits between pieces
        (run each piece under the same grad mode as a call would be).
        """
        batch, _, total = mel.shape
        finals = [bool(finalize)] * batch if isinstance(finalize, bool) else [bool(f) for f in finalize]
        lens = self._check(mel, mel_lens, finals)
        if any(n != total for n in lens):
            keep = (
                torch.arange(total, device=mel.device)[None, :]
                < torch.tensor(lens, device=mel.device)[:, None]
            )
            mel = torch.where(keep[:, None, :], mel, torch.zeros((), dtype=mel.dtype, device=mel.device))
        f0 = self.f0_predictor(mel)  # [B, T] float64, zero look-ahead past each row's end
        source, running = self.m_source(
            f0.to(torch.float32), sample_offsets=sample_offsets, phase_resume=phase_resume
        )  # [B, 1, S*T], [B, T, H]
        look = F0Predictor.look_ahead
        f0_frames = [n if final else n - look for n, final in zip(lens, finals, strict=True)]
        dec_frames = [
            n if final else n - look - self.config.conv_pre_look_right
            for n, final in zip(lens, finals, strict=True)
        ]
        spf = self.samples_per_frame
        hop_frames = spf // self.config.istft_hop_len  # STFT frames per mel frame
        source_lens = [spf * n for n in f0_frames]
        wave = yield from self._decode(mel, source, source_lens, [hop_frames * n + 1 for n in dec_frames])  # [B, S*T]
        speech_lens = [
            spf * n if final else spf * (n - 1) for n, final in zip(dec_frames, finals, strict=True)
        ]
        wave = wave[:, : max(speech_lens)]  # [B, L]
        limit = self.config.audio_limit
        return HiftOutput(
            speech=torch.clamp(wave, -limit, limit),
            speech_lens=speech_lens,
            source=source[:, :, : max(source_lens)],
            source_lens=source_lens,
            phase_running=running,
        )
