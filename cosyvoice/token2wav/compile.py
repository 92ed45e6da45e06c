"""Opt-in ``torch.compile`` fast path for the two per-hop hot spots of :class:`Token2Wav`.

* ``"flow"``: the DiT estimator's forward, called once per Euler step (10 or 20 times per flow batch).
* ``"hift"``: the vocoder's decoder network (:meth:`CausalHift.decode_spectrum`: conv_pre, the upsampling
  stages with the source branch and resblocks, conv_post); the per-row length handling around it (f0,
  NSF source, STFT / iSTFT) stays eager.

Both regions are pure tensor code with no host syncs and trace as one graph each (``fullgraph=True``).
Shapes change with every hop (batch rows, frames). ``dynamic=True`` (the default) marks exactly the batch
and time axes of every input dynamic before each call (``torch._dynamo.maybe_mark_dynamic``) and leaves
everything else static: ``torch.compile(dynamic=True)`` would also make channel sizes and Python floats
(eps, slopes) symbolic, which costs a retrace and buys nothing. Each region then compiles a handful of
graphs, not one per shape. To keep the set of shapes small anyway (what ``dynamic=False`` and CUDA graphs
need), the time axis can be padded up to a multiple of ``*_frame_multiple`` frames: the flow pads inside
:meth:`CausalCFM.solve` (padded frames are masked as attention keys and the positional conv is causal),
the vocoder pads mel and source spectrum with zero frames on the right (its convs are causal, conv_pre
looks ahead into zeros either way). Outputs stay equal to eager within floating point tolerance.

Usage::

    compiled = compile_token2wav(token2wav, backend="inductor", dynamic=True)
    ...                                   # token2wav.run(jobs) now uses the compiled regions
    compiled.graphs                       # {"flow": 2, "hift": 1}: graphs compiled so far per target
    compiled.restore()                    # back to eager

Compiled code is cached per code object by dynamo; each call here gets its own isolated cache
(``isolate_recompiles``) of at most ``recompile_limit`` graphs per target. A target that needs more
(``fullgraph=True`` makes dynamo raise ``FailOnRecompileLimitHit`` before running anything) logs a
warning and runs eager from then on (:attr:`CompiledToken2Wav.fell_back`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from cosyvoice.token2wav.runner import Token2Wav

__all__ = [
    "TARGETS",
    "CompileError",
    "CompileSettings",
    "CompiledToken2Wav",
    "compile_token2wav",
]

TARGETS = ("flow", "hift")

logger = logging.getLogger(__name__)


class CompileError(ValueError):
    """Bad arguments for the compile path (unknown target, backend or mode, bad multiple, compiled twice)."""


def _positive_int(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CompileError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class CompileSettings:
    """What :func:`compile_token2wav` does; validated on construction."""

    backend: str = "inductor"
    mode: str | None = None  # inductor only: "default", "reduce-overhead", "max-autotune", ...
    dynamic: bool = True  # True: batch and time axes symbolic; False: one graph per shape
    fullgraph: bool = True
    targets: tuple[str, ...] = TARGETS
    flow_frame_multiple: int = 1  # pad each flow solve's time axis to a multiple of this (1 = no padding)
    hift_frame_multiple: int = 1  # pad the vocoder's mel frames to a multiple of this (1 = no padding)
    recompile_limit: int = 16  # graphs per target; past it the target runs eager

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or self.backend not in torch._dynamo.list_backends(None):
            raise CompileError(
                f"unknown torch.compile backend {self.backend!r}; known: {torch._dynamo.list_backends(None)}"
            )
        if self.mode is not None:
            if self.backend != "inductor":
                raise CompileError(f"mode {self.mode!r} needs the inductor backend, not {self.backend!r}")
            from torch._inductor import list_mode_options

            if self.mode not in list_mode_options():
                raise CompileError(f"unknown inductor mode {self.mode!r}; known: {list(list_mode_options())}")
        if not isinstance(self.dynamic, bool):
            raise CompileError(f"dynamic must be a bool, got {self.dynamic!r}")
        if not isinstance(self.fullgraph, bool):
            raise CompileError(f"fullgraph must be a bool, got {self.fullgraph!r}")
        targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
        unknown = [t for t in targets if t not in TARGETS]
        if not targets or unknown or len(set(targets)) != len(targets):
            raise CompileError(f"targets must be distinct names from {TARGETS}, got {self.targets!r}")
        object.__setattr__(self, "targets", targets)
        _positive_int(self.flow_frame_multiple, "flow_frame_multiple")
        _positive_int(self.hift_frame_multiple, "hift_frame_multiple")
        _positive_int(self.recompile_limit, "recompile_limit")


class _CountingBackend:
    """A dynamo backend that counts the graphs it compiles and hands them to the real backend."""

    def __init__(self, settings: CompileSettings) -> None:
        self.count = 0
        if settings.backend == "inductor":
            from torch._inductor import list_mode_options
            from torch._inductor.compile_fx import compile_fx

            patches = dict(list_mode_options(settings.mode, settings.dynamic)) if settings.mode else {}
            self._compile: Callable = functools.partial(compile_fx, config_patches=patches)
        else:
            self._compile = torch._dynamo.lookup_backend(settings.backend)

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable:
        compiled = self._compile(graph, example_inputs)
        self.count += 1  # after success: an attempt dynamo restarts is not a graph
        return compiled


def _mark(tensor: torch.Tensor, *dims: int) -> None:
    for dim in dims:
        if tensor.shape[dim] > 1:  # a size-1 axis is broadcast, not batch: leave it static
            torch._dynamo.maybe_mark_dynamic(tensor, dim)


def _mark_estimator_inputs(
    x: torch.Tensor,
    mu: torch.Tensor,
    cond: torch.Tensor,
    spk: torch.Tensor,
    modulation: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    attn_mask: torch.Tensor | None = None,
) -> None:
    """Batch and time axes of the DiT step's arguments (as :meth:`DiT.forward`)."""
    for t in (x, mu, cond):
        _mark(t, 0, 1)  # [B, T, 80]
    _mark(spk, 0)  # [B, 80]
    for t in rope:
        _mark(t, 0)  # [T, Dh]
    if attn_mask is not None:
        _mark(attn_mask, 0, 2, 3)  # [B or 1, 1, T, T]


def _mark_decoder_inputs(mel: torch.Tensor, spec: torch.Tensor) -> None:
    """Batch and time axes of :meth:`CausalHift.decode_spectrum`'s arguments."""
    _mark(mel, 0, 2)  # [B, C, T]
    _mark(spec, 0, 2)  # [B, n_fft + 2, S*T/hop + 1]


class _Region:
    """One compiled target: marks the dynamic axes, calls the compiled function; once dynamo refuses to
    compile another graph (``recompile_limit`` with ``fullgraph=True``) it runs eager for good."""

    def __init__(
        self, name: str, eager: Callable, settings: CompileSettings, mark: Callable[..., None]
    ) -> None:
        self.name = name
        self.eager = eager
        self.backend = _CountingBackend(settings)
        self.compiled = torch.compile(
            eager,
            backend=self.backend,
            fullgraph=settings.fullgraph,
            dynamic=None if settings.dynamic else False,  # None: only the marked axes start dynamic
            recompile_limit=settings.recompile_limit,
            isolate_recompiles=True,
        )
        self.mark = mark if settings.dynamic else None
        self.fell_back = False

    def __call__(self, *args: Any) -> Any:
        if self.fell_back:
            return self.eager(*args)
        if self.mark is not None:
            self.mark(*args)
        try:
            return self.compiled(*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit:  # raised before anything ran
            logger.warning("%s: recompile limit hit, running eager from now on", self.name)
            self.fell_back = True
            return self.eager(*args)


def _bucketed_decoder(decode: Callable, multiple: int, spec_frames_per_mel: int) -> Callable:
    """Wrap ``decode_spectrum(mel, spec)`` so it runs on mel frames padded to a multiple of ``multiple``."""

    def decode_spectrum(mel: torch.Tensor, spec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        frames, spec_frames = mel.shape[-1], spec.shape[-1]  # T, S*T/hop + 1
        extra = math.ceil(frames / multiple) * multiple - frames
        if extra == 0 or spec_frames != spec_frames_per_mel * frames + 1:
            return decode(mel, spec)
        mel = F.pad(mel, (0, extra))  # [B, C, T_pad]
        spec = F.pad(spec, (0, extra * spec_frames_per_mel))  # [B, n_fft + 2, S*T_pad/hop + 1]
        magnitude, phase = decode(mel, spec)
        return magnitude[..., :spec_frames], phase[..., :spec_frames]  # each [B, bins, F]

    return decode_spectrum


@dataclass(eq=False)
class CompiledToken2Wav:
    """Handle of a compiled :class:`Token2Wav`: graph counts per target and :meth:`restore`."""

    token2wav: Token2Wav
    settings: CompileSettings
    _regions: dict[str, _Region] = field(default_factory=dict, repr=False)
    _restore: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def graphs(self) -> dict[str, int]:
        """Graphs compiled so far per target (first compile included; each further one is a recompile)."""
        return {name: region.backend.count for name, region in self._regions.items()}

    @property
    def fell_back(self) -> tuple[str, ...]:
        """Targets that hit the recompile limit and run eager now."""
        return tuple(name for name, region in self._regions.items() if region.fell_back)

    @property
    def active(self) -> bool:
        return bool(self._restore)

    def restore(self) -> None:
        """Put the eager functions and the unpadded shapes back (compiled code stays in dynamo's cache)."""
        while self._restore:
            self._restore.pop()()


def _is_compiled(token2wav: Token2Wav) -> bool:
    """Whether a compiled function already shadows one of the target methods (instance attributes)."""
    return "forward" in vars(token2wav.flow.decoder.estimator) or "decode_spectrum" in vars(token2wav.hift)


def compile_token2wav(
    token2wav: Token2Wav,
    *,
    mode: str | None = None,
    backend: str = "inductor",
    dynamic: bool = True,
    fullgraph: bool = True,
    targets: Sequence[str] = TARGETS,
    flow_frame_multiple: int = 1,
    hift_frame_multiple: int = 1,
    recompile_limit: int = 16,
) -> CompiledToken2Wav:
    """Compile the DiT step (``"flow"``) and the vocoder network (``"hift"``) of ``token2wav`` in place.

    Nothing is compiled until the first call: the first hop of each new shape class pays the compile
    time (use a warm-up run). ``flow_frame_multiple`` of the flow's attention chunk (50 frames in the
    release) and a ``hift_frame_multiple`` of a few tens of frames bound the shapes for ``dynamic=False``
    or CUDA graphs (``mode="reduce-overhead"``); with ``dynamic=True`` they are not needed to avoid
    recompiles. Raises :class:`CompileError` on bad arguments or when ``token2wav`` is already compiled.
    """
    if not isinstance(token2wav, Token2Wav):
        raise CompileError(f"expected a Token2Wav, got {type(token2wav).__name__}")
    if _is_compiled(token2wav):
        raise CompileError("this Token2Wav is already compiled; call restore() on its handle first")
    settings = CompileSettings(
        backend=backend,
        mode=mode,
        dynamic=dynamic,
        fullgraph=fullgraph,
        targets=tuple(targets) if not isinstance(targets, str) else targets,
        flow_frame_multiple=flow_frame_multiple,
        hift_frame_multiple=hift_frame_multiple,
        recompile_limit=recompile_limit,
    )
    handle = CompiledToken2Wav(token2wav=token2wav, settings=settings)
    if "flow" in settings.targets:
        decoder = token2wav.flow.decoder
        estimator = decoder.estimator
        region = handle._regions["flow"] = _Region(
            "flow", estimator.forward, settings, _mark_estimator_inputs
        )
        estimator.forward = region  # an instance attribute shadows the method
        previous_multiple = decoder.frame_multiple
        decoder.frame_multiple = settings.flow_frame_multiple

        def restore_flow() -> None:
            del estimator.forward
            decoder.frame_multiple = previous_multiple

        handle._restore.append(restore_flow)
    if "hift" in settings.targets:
        hift = token2wav.hift
        region = handle._regions["hift"] = _Region(
            "hift", hift.decode_spectrum, settings, _mark_decoder_inputs
        )
        decode: Callable = region
        if settings.hift_frame_multiple > 1:
            ratio = hift.samples_per_frame // hift.config.istft_hop_len  # STFT frames per mel frame
            decode = _bucketed_decoder(region, settings.hift_frame_multiple, ratio)
        hift.decode_spectrum = decode

        def restore_hift() -> None:
            del hift.decode_spectrum

        handle._restore.append(restore_hift)
    return handle
