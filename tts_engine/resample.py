"""Band-limited resampling on torch, offline and streaming, with identical results.

Method: windowed-sinc polyphase interpolation. With ``up/down = new_sr/orig_sr`` reduced by
their gcd, output sample ``n`` sits at input position ``p = n * down / up`` (zero phase: no
group delay, output ``n`` is aligned with input time ``n / new_sr``) and is

    y[n] = sum_k x[k] * h(p - k),   h(t) = 2 fc sinc(2 fc t) * kaiser(t / half_width)

with cutoff ``fc = ROLLOFF * min(orig_sr, new_sr) / 2`` (in cycles per input sample:
``ROLLOFF * min(up, down) / (2 * down)``), ``ZERO_CROSSINGS`` sinc zero crossings on each side
and a Kaiser window (``KAISER_BETA``). Each phase's taps are normalised to sum to 1 (exact DC
gain). Samples before the start and after the end of the signal are zeros.

Length rule: a signal of ``T`` input samples gives ``ceil(T * new_sr / orig_sr)`` output
samples, the outputs whose position ``p`` falls before the end of the input
(``n * down < T * up``).

Streaming: ``StreamingResampler.process()`` emits every output whose filter support is fully
received; ``flush()`` emits the rest with zeros as the future. For any split of a signal into
chunks, the concatenated outputs equal ``resample()`` of the whole signal (the same taps meet
the same samples; only float rounding can differ).

State per stream is small (a buffer of about one filter width of input plus two counters),
so a batch of streams with the same rate pair can later share ``_Kernel`` and stack buffers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

__all__ = ["StreamingResampler", "output_length", "process_batch", "resample"]

ROLLOFF = 0.95
ZERO_CROSSINGS = 48
KAISER_BETA = 6.0
_MAX_PHASES = 4096  # up after gcd reduction; bounds the tap table


@dataclass(frozen=True, slots=True)
class _Kernel:
    """Polyphase taps of one rate pair: ``taps[r, j]`` weights input ``floor(n*down/up) - left + j``
    for every output ``n`` with ``n % up == r``."""

    up: int
    down: int
    left: int
    taps: torch.Tensor  # (up, width)
    poly: torch.Tensor  # (up, down, blocks): phase taps laid out over the input's polyphase channels

    @property
    def width(self) -> int:
        return self.taps.shape[1]

    def first_input(self, n: int) -> int:
        """Absolute index of the first input sample that output ``n`` uses."""
        return n * self.down // self.up - self.left

    def num_outputs_before(self, num_input: int) -> int:
        """How many outputs have their position before input index ``num_input``."""
        return max(0, -(-num_input * self.up // self.down))

    def to(self, device: torch.device | str | None, dtype: torch.dtype) -> _Kernel:
        return _Kernel(
            self.up,
            self.down,
            self.left,
            self.taps.to(device=device, dtype=dtype),
            self.poly.to(device=device, dtype=dtype),
        )


def _poly_weight(taps: torch.Tensor, up: int, down: int) -> torch.Tensor:
    """Weights for one stride-1 conv1d over the input split into ``down`` polyphase channels.

    Output ``n = r + up*k`` reads inputs from ``k*down + r*down//up - left``. Laying phase ``r``'s
    taps at offset ``r*down//up`` in a row of ``blocks*down`` (a multiple of ``down``) and folding
    that row into ``(down, blocks)`` turns every phase into one output channel of a conv over
    channels ``c`` = input index mod ``down``: far cheaper on CPU than a strided conv.
    """
    offsets = [r * down // up for r in range(up)]
    width = taps.shape[1]
    blocks = -(-(width + max(offsets)) // down)
    row = taps.new_zeros(up, blocks * down)
    for r, off in enumerate(offsets):
        row[r, off : off + width] = taps[r]
    return row.reshape(up, blocks, down).transpose(1, 2).contiguous()  # (up, down, blocks)


def output_length(num_input: int, orig_sr: int, new_sr: int) -> int:
    """Output samples for ``num_input`` input samples: ``ceil(num_input * new_sr / orig_sr)``."""
    _check_rates(orig_sr, new_sr)
    return -(-num_input * new_sr // orig_sr)


def resample(x: torch.Tensor, orig_sr: int, new_sr: int) -> torch.Tensor:
    """Resample the last dimension of a float tensor ([T] or [B, T]) from ``orig_sr`` to ``new_sr``."""
    _check_rates(orig_sr, new_sr)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim < 1:
        raise TypeError("resample needs a floating-point torch.Tensor with at least one dimension")
    if orig_sr == new_sr:
        return x.clone()
    kernel = _design_kernel(*_reduced(orig_sr, new_sr)).to(x.device, x.dtype)
    num_input = x.shape[-1]
    num_output = kernel.num_outputs_before(num_input)
    if num_output == 0:
        return x.new_zeros((*x.shape[:-1], 0))
    end = kernel.first_input(num_output - 1) + kernel.width  # one past the last input used
    padded = torch.nn.functional.pad(x, (kernel.left, max(0, end - num_input)))
    return _apply_kernel(kernel, padded, -kernel.left, 0, num_output)


class StreamingResampler:
    """Resample one stream chunk by chunk; outputs match ``resample()`` of the whole stream."""

    def __init__(
        self,
        orig_sr: int,
        new_sr: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        _check_rates(orig_sr, new_sr)
        if not dtype.is_floating_point:
            raise TypeError(f"StreamingResampler dtype must be floating point, got {dtype}")
        self.orig_sr = orig_sr
        self.new_sr = new_sr
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dtype = dtype
        self._kernel: _Kernel | None = None
        if orig_sr != new_sr:
            self._kernel = _design_kernel(*_reduced(orig_sr, new_sr)).to(self.device, dtype)
        self.reset()

    @property
    def lookahead(self) -> int:
        """Input samples needed beyond an output's position before it can be emitted."""
        if self._kernel is None:
            return 0
        return self._kernel.width - self._kernel.left - 1

    def reset(self) -> None:
        """Forget the stream: the next ``process()`` starts a new one."""
        left = self._kernel.left if self._kernel is not None else 0
        self._buffer = torch.zeros(left, device=self.device, dtype=self.dtype)
        self._buffer_start = -left  # absolute input index of _buffer[0]; before 0 are zeros
        self._num_input = 0
        self._num_output = 0

    def process(self, x: torch.Tensor) -> torch.Tensor:
        """Add a 1-D chunk; return every output sample whose filter support is now complete."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim != 1:
            raise TypeError("StreamingResampler.process needs a 1-D floating-point torch.Tensor")
        x = x.to(device=self.device, dtype=self.dtype)
        self._num_input += x.shape[0]
        if self._kernel is None:
            return x.clone()
        self._buffer = torch.cat([self._buffer, x])
        # Output n is ready once input first_input(n) + width - 1 has arrived.
        kernel = self._kernel
        last_first_input = self._num_input - kernel.width  # largest usable first_input(n)
        num_ready = kernel.num_outputs_before(last_first_input + kernel.left + 1)
        return self._emit(kernel, num_ready)

    def flush(self) -> torch.Tensor:
        """Emit the remaining outputs, taking the future as zeros, and reset for a new stream."""
        out = self._buffer.new_zeros(0)
        kernel = self._kernel
        if kernel is not None:
            num_total = kernel.num_outputs_before(self._num_input)
            if num_total > self._num_output:
                end = kernel.first_input(num_total - 1) + kernel.width
                missing = end - (self._buffer_start + self._buffer.shape[0])
                if missing > 0:
                    self._buffer = torch.cat([self._buffer, self._buffer.new_zeros(missing)])
                out = self._emit(kernel, num_total)
        self.reset()
        return out

    def _append(self, x: torch.Tensor) -> int:
        """Take a chunk into the buffer; return how many outputs are ready (``process()`` minus the conv)."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim != 1:
            raise TypeError("StreamingResampler.process needs a 1-D floating-point torch.Tensor")
        kernel = self._kernel
        if kernel is None:
            raise ValueError("an identity resampler has nothing to batch")
        self._num_input += x.shape[0]
        self._buffer = torch.cat([self._buffer, x.to(device=self.device, dtype=self.dtype)])
        return kernel.num_outputs_before(self._num_input - kernel.width + kernel.left + 1)

    def _emit(self, kernel: _Kernel, num_ready: int) -> torch.Tensor:
        if num_ready <= self._num_output:
            return self._buffer.new_zeros(0)
        out = _apply_kernel(kernel, self._buffer, self._buffer_start, self._num_output, num_ready)
        self._commit(kernel, num_ready)
        return out

    def _commit(self, kernel: _Kernel, num_ready: int) -> None:
        """Outputs up to ``num_ready`` were emitted: drop the inputs no later output needs."""
        self._num_output = num_ready
        keep_from = kernel.first_input(num_ready)  # the first input the next output needs
        drop = min(max(0, keep_from - self._buffer_start), self._buffer.shape[0])
        self._buffer = self._buffer[drop:]
        self._buffer_start += drop


def process_batch(resamplers: list[StreamingResampler], chunks: list[torch.Tensor]) -> list[torch.Tensor]:
    """``[r.process(c) for r, c in zip(resamplers, chunks)]`` with one conv per (rate pair, device) group.

    Each stream's pending input window is cut from its own buffer, windows are zero-padded to the
    longest and stacked, and one ``conv1d`` computes every row; each row keeps only its own outputs,
    so results equal the per-stream ones (up to float rounding of a different conv shape).
    """
    if len(resamplers) != len(chunks):
        raise ValueError(f"{len(resamplers)} resamplers for {len(chunks)} chunks")
    results: list[torch.Tensor | None] = [None] * len(chunks)
    groups: dict[tuple[int, int, torch.device, torch.dtype], list[int]] = {}
    for i, (resampler, chunk) in enumerate(zip(resamplers, chunks, strict=True)):
        if resampler._kernel is None:
            results[i] = resampler.process(chunk)
            continue
        key = (resampler.orig_sr, resampler.new_sr, resampler.device, resampler.dtype)
        groups.setdefault(key, []).append(i)
    for rows in groups.values():
        ready: list[tuple[int, int]] = []  # (row, num_ready) of rows with new outputs
        for i in rows:
            resampler = resamplers[i]
            num_ready = resampler._append(chunks[i])
            if num_ready > resampler._num_output:
                ready.append((i, num_ready))
            else:
                results[i] = resampler._buffer.new_zeros(0)
        if ready:
            for i, out in zip((i for i, _ in ready), _apply_batch(resamplers, ready), strict=True):
                results[i] = out
    return [r if r is not None else torch.zeros(0) for r in results]


def _apply_batch(resamplers: list[StreamingResampler], ready: list[tuple[int, int]]) -> list[torch.Tensor]:
    """One conv over the stacked input windows of ``ready`` rows (same kernel); commits each row."""
    first = resamplers[ready[0][0]]
    kernel = first._kernel
    if kernel is None:
        raise ValueError("an identity resampler has nothing to batch")
    up, down, blocks = kernel.up, kernel.down, kernel.poly.shape[-1]
    spans = []  # (row, n_start, n_end, k_start, num_k)
    for i, num_ready in ready:
        n_start = resamplers[i]._num_output
        k_start, k_end = n_start // up, -(-num_ready // up)
        spans.append((i, n_start, num_ready, k_start, k_end - k_start))
    max_k = max(span[4] for span in spans)
    width = (max_k + blocks - 1) * down
    windows = first._buffer.new_zeros(len(spans), width)  # [B, width]
    for row, (i, _, _, k_start, num_k) in enumerate(spans):
        r = resamplers[i]
        begin = k_start * down - kernel.left - r._buffer_start  # buffer index of the window's start
        end = begin + (num_k + blocks - 1) * down
        lo, hi = max(begin, 0), min(end, r._buffer.shape[0])
        windows[row, lo - begin : hi - begin] = r._buffer[lo:hi]
    channels = windows.reshape(len(spans), max_k + blocks - 1, down).transpose(1, 2)  # [B, down, K+blocks-1]
    y = torch.nn.functional.conv1d(channels, kernel.poly)  # [B, up, K]
    y = y.transpose(1, 2).reshape(len(spans), -1)  # [B, K * up] in output order
    outs = []
    for row, (i, n_start, n_end, k_start, _) in enumerate(spans):
        outs.append(y[row, n_start - k_start * up : n_end - k_start * up])
        resamplers[i]._commit(kernel, n_end)
    return outs


def _apply_kernel(
    kernel: _Kernel, buffer: torch.Tensor, buffer_start: int, n_start: int, n_end: int
) -> torch.Tensor:
    """Outputs ``n_start..n_end-1`` from ``buffer`` ([..., T], holding inputs from ``buffer_start``).

    Whole blocks of ``up`` outputs are computed at once; outputs of a partial first or last block
    are computed on zero padding and dropped, so only inputs the caller vouches for count.
    """
    up, down = kernel.up, kernel.down
    blocks = kernel.poly.shape[-1]
    k_start, k_end = n_start // up, -(-n_end // up)
    num_k = k_end - k_start
    begin = k_start * down - kernel.left - buffer_start  # buffer index of block k_start's first input
    end = begin + (num_k + blocks - 1) * down
    length = buffer.shape[-1]
    segment = buffer[..., max(begin, 0) : min(end, length)]
    segment = torch.nn.functional.pad(segment, (max(0, -begin), max(0, end - length)))
    lead = segment.shape[:-1]
    channels = segment.reshape(-1, num_k + blocks - 1, down).transpose(1, 2)  # (B, down, K + blocks - 1)
    y = torch.nn.functional.conv1d(channels, kernel.poly)  # (B, up, K)
    y = y.transpose(1, 2).reshape(*lead, -1)  # (..., K * up), in output order
    return y[..., n_start - k_start * up : n_end - k_start * up]


def _check_rates(orig_sr: int, new_sr: int) -> None:
    for name, rate in (("orig_sr", orig_sr), ("new_sr", new_sr)):
        if isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0:
            raise ValueError(f"{name} must be a positive int, got {rate!r}")
    if orig_sr != new_sr:
        up, _ = _reduced(orig_sr, new_sr)
        if up > _MAX_PHASES:
            raise ValueError(
                f"rate pair {orig_sr}->{new_sr} needs {up} filter phases (limit {_MAX_PHASES}); "
                "use rates with a larger common divisor"
            )


def _reduced(orig_sr: int, new_sr: int) -> tuple[int, int]:
    gcd = math.gcd(orig_sr, new_sr)
    return new_sr // gcd, orig_sr // gcd


@functools.lru_cache(maxsize=32)
def _design_kernel(up: int, down: int) -> _Kernel:
    """Float64 CPU taps for the reduced ratio ``up/down`` (see the module docstring)."""
    cutoff = ROLLOFF * min(up, down) / (2 * down)  # cycles per input sample
    half_width = ZERO_CROSSINGS / (2 * cutoff)  # input samples on each side
    left = math.ceil(half_width)
    width = 2 * left + 2  # covers [p - half_width, p + half_width] for any fractional p
    frac = (torch.arange(up, dtype=torch.float64) * down % up) / up  # (up,) fractional positions
    t = frac[:, None] + left - torch.arange(width, dtype=torch.float64)[None, :]  # (up, width): p - k
    inside = t.abs() <= half_width
    ratio = (t / half_width).clamp(-1.0, 1.0)
    window = torch.special.i0(KAISER_BETA * torch.sqrt(1.0 - ratio**2)) / torch.special.i0(
        torch.tensor(KAISER_BETA, dtype=torch.float64)
    )
    taps = torch.where(inside, 2 * cutoff * torch.sinc(2 * cutoff * t) * window, 0.0)
    taps = taps / taps.sum(dim=1, keepdim=True)
    return _Kernel(up=up, down=down, left=left, taps=taps, poly=_poly_weight(taps, up, down))
