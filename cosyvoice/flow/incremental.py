"""The CFM solve over only the frames after each row's cached chunks (see cosyvoice/flow/chunk_cache.py).

Row b computes frames ``starts[b] .. starts[b] + lengths[b] - 1``; ``starts[b]`` is the end of its cached
segments (a chunk boundary). Per Euler step and DiT block the new frames' queries attend to the cached
keys/values of frames ``0 .. starts[b] - 1`` (all visible: complete earlier chunks) and to the new frames
(block-causal for streaming rows, all of them for full-attention rows, which never have a cache). The
causal conv position embedding continues from the cached left context. Keys sit in one scratch buffer
per call, ``[new frames | cached frames]`` (attention does not care about key order; rotary positions
are absolute), refilled for every (step, block).

Everything else is the plain solve of :class:`~cosyvoice.flow.cfm.CausalCFM` (fixed noise indexed by the
absolute frame, the same Euler schedule and CFG combination), so results equal a full recompute up to
floating point rounding.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .cfm import CausalCFM
from .chunk_cache import CacheKey, ChunkSegment, FlowRowCache, segment_bytes
from .config import FlowConfig
from .dit import LAYER_NORM_EPS, DiT, apply_head0_rope_

__all__ = ["run_steps", "solve_cached", "solve_cached_steps", "solve_with_caches", "solve_with_caches_steps"]

T = TypeVar("T")


class _Captures:
    """Where one call writes the state of the new segments it was asked to keep."""

    def __init__(
        self,
        dit: DiT,
        starts: Sequence[int],
        bounds: Sequence[Sequence[int]],
        steps: int,
        copies: int,
        like: Tensor,
    ) -> None:
        cfg = dit.cfg
        self.window = cfg.conv_kernel - 1
        self.rows: list[list[ChunkSegment]] = []
        for start, ends in zip(starts, bounds, strict=True):
            segments, begin = [], start
            for end in ends:
                n = end - begin
                kv = (steps, cfg.depth, copies, cfg.heads, n, cfg.dim_head)
                tail = (steps, copies, self.window, cfg.dim)
                segments.append(
                    ChunkSegment(
                        start=begin,
                        k=like.new_empty(kv),
                        v=like.new_empty(kv),
                        conv_in=like.new_empty(tail),
                        conv_mid=like.new_empty(tail),
                    )
                )
                begin = end
            self.rows.append(segments)
        self.starts = list(starts)
        self.batch = len(starts)

    def keys(self, step: int, layer: int, k: Tensor, v: Tensor) -> None:
        """k, v [R, H, Tn, Dh] of the new frames (R = copies * B)."""
        for b, segments in enumerate(self.rows):
            for seg in segments:
                a, e = seg.start - self.starts[b], seg.end - self.starts[b]
                seg.k[step, layer].copy_(k[b :: self.batch, :, a:e])
                seg.v[step, layer].copy_(v[b :: self.batch, :, a:e])

    def tails(self, step: int, conv_in: Tensor, conv_mid: Tensor) -> None:
        """conv_in, conv_mid [R, W + Tn, D]: left context followed by the new frames."""
        for b, segments in enumerate(self.rows):
            for seg in segments:
                e = seg.end - self.starts[b]  # frame seg.end - W .. seg.end - 1 sit at e .. e + W - 1
                seg.conv_in[step].copy_(conv_in[b :: self.batch, e : e + self.window])
                seg.conv_mid[step].copy_(conv_mid[b :: self.batch, e : e + self.window])


def _attention_mask(
    starts: Sequence[int], lengths: Sequence[int], streaming: Sequence[bool], new: int, chunk: int, copies: int,
    device: torch.device, dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """Additive mask [R, 1, Tn, Tn + max(starts)] over keys laid out as [new frames | cached frames]."""
    past = max(starts)
    q = torch.arange(new, device=device)
    lens = torch.tensor(list(lengths), device=device)[:, None, None]  # [B, 1, 1]
    stream = torch.tensor(list(streaming), device=device)[:, None, None]
    key_new = q[None, None, :] < lens  # [B, 1, Tn] valid new keys
    causal = (q[None, :] // chunk <= q[:, None] // chunk)[None]  # [1, Tn, Tn] key chunk <= query chunk
    see_new = key_new & (causal | ~stream)  # [B, Tn, Tn]
    key_past = (
        torch.arange(past, device=device)[None, None, :]
        < torch.tensor(list(starts), device=device)[:, None, None]
    )  # [B, 1, P]
    mask = torch.cat((see_new, key_past.expand(-1, new, -1)), dim=-1)  # [B, Tn, Tn + P]
    mask = mask | ~mask.any(dim=-1, keepdim=True)  # padded query rows: open (never read)
    mask = mask.repeat(copies, 1, 1)[:, None]  # [R, 1, Tn, Tn + P]
    return torch.zeros(mask.shape, device=device, dtype=dtype).masked_fill_(~mask, float("-inf"))


def _fill_past(
    buf: Tensor, which: str, step: int, layer: int, past: Sequence[Sequence[ChunkSegment]], new: int
) -> None:
    batch = len(past)
    for b, segments in enumerate(past):
        for seg in segments:
            buf[b::batch, :, new + seg.start : new + seg.end].copy_(getattr(seg, which)[step, layer])


def _conv_tails(
    past: Sequence[Sequence[ChunkSegment]], step: int, copies: int, like: Tensor
) -> tuple[Tensor, Tensor]:
    """Left context [R, W, D] of conv1 and conv2 for ``step``: the cached tails, zeros without a cache."""
    batch = len(past)
    tail_in = like.new_zeros(copies * batch, *like.shape[1:])
    tail_mid = like.new_zeros(copies * batch, *like.shape[1:])
    for b, segments in enumerate(past):
        if segments:
            tail_in[b::batch] = segments[-1].conv_in[step]
            tail_mid[b::batch] = segments[-1].conv_mid[step]
    return tail_in, tail_mid


def _estimate(
    dit: DiT,
    x: Tensor,
    mu: Tensor,
    cond: Tensor,
    spk: Tensor,
    mod: Tensor,
    rope: tuple[Tensor, Tensor],
    mask: Tensor,
    step: int,
    past: Sequence[Sequence[ChunkSegment]],
    scratch: tuple[Tensor, Tensor] | None,
    captures: _Captures,
) -> Tensor:
    """Velocity of the new frames: x, mu, cond [R, Tn, 80], spk [R, 80], mod [1, M] -> [R, Tn, 80]."""
    cfg = dit.cfg
    rows, new, _ = x.shape
    dim, inner, window = cfg.dim, cfg.inner_dim, cfg.conv_kernel - 1
    h = dit.input_proj(torch.cat((x, cond, mu, spk.unsqueeze(1).expand(rows, new, spk.shape[-1])), dim=-1))
    tail_in, tail_mid = _conv_tails(past, step, rows // len(past), h.new_empty(1, window, dim))
    conv_in = torch.cat((tail_in, h), dim=1)  # [R, W + Tn, D]
    mid = F.mish(dit.conv_pos.conv1(conv_in.transpose(1, 2))).transpose(1, 2)  # [R, Tn, D]
    conv_mid = torch.cat((tail_mid, mid), dim=1)  # [R, W + Tn, D]
    captures.tails(step, conv_in, conv_mid)
    h = F.mish(dit.conv_pos.conv2(conv_mid.transpose(1, 2))).transpose(1, 2) + h
    for layer, block in enumerate(dit.blocks):
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = (
            mod[:, layer * 6 * dim : (layer + 1) * 6 * dim].unflatten(-1, (6, dim)).unsqueeze(1).unbind(2)
        )
        a = F.layer_norm(h, (dim,), eps=LAYER_NORM_EPS) * (1 + scale_a) + shift_a
        attn = block.attn
        qkv = attn.qkv(a)  # [R, Tn, 3 * inner]
        apply_head0_rope_(qkv, inner, *rope)
        q, k, v = qkv.view(rows, new, 3, attn.heads, attn.dim_head).permute(2, 0, 3, 1, 4).unbind(0)
        key_buf, value_buf = k, v  # no row has cached frames: the new keys are all the keys
        if scratch is not None:
            key_buf, value_buf = scratch
            key_buf[:, :, :new].copy_(k)
            value_buf[:, :, :new].copy_(v)
            _fill_past(key_buf, "k", step, layer, past, new)
            _fill_past(value_buf, "v", step, layer, past, new)
        captures.keys(step, layer, k, v)
        o = F.scaled_dot_product_attention(q, key_buf, value_buf, attn_mask=mask)  # [R, H, Tn, Dh]
        h = h + gate_a * attn.out(o.transpose(1, 2).reshape(rows, new, inner))
        f = F.layer_norm(h, (dim,), eps=LAYER_NORM_EPS) * (1 + scale_f) + shift_f
        h = h + gate_f * block.ff2(F.gelu(block.ff1(f), approximate="tanh"))
    depth = cfg.depth
    scale, shift = mod[:, depth * 6 * dim :].unflatten(-1, (2, dim)).unsqueeze(1).unbind(2)
    h = F.layer_norm(h, (dim,), eps=LAYER_NORM_EPS) * (1 + scale) + shift
    return dit.proj_out(h)


def solve_cached(*args: Any, **kwargs: Any) -> tuple[Tensor, list[list[ChunkSegment]]]:
    """:func:`solve_cached_steps` run to its end."""
    return run_steps(solve_cached_steps(*args, **kwargs))


def solve_cached_steps(
    cfm: CausalCFM,
    mu: Tensor,
    cond: Tensor,
    spk: Tensor,
    starts: Sequence[int],
    lengths: Sequence[int],
    streaming: Sequence[bool],
    past: Sequence[Sequence[ChunkSegment]],
    keep: Sequence[Sequence[int]],
    *,
    n_timesteps: int,
    cfg_rate: float,
    temperature: float = 1.0,
) -> Generator[None, None, tuple[Tensor, list[list[ChunkSegment]]]]:
    """Integrate the new frames of every row.

    mu, cond [B, Tn, 80]: row b's inputs for frames ``starts[b] ..`` (``lengths[b]`` valid, right-padded
    with finite values); spk [B, 80]; ``past[b]`` the cached segments covering frames 0 .. starts[b] - 1
    (empty when starts[b] == 0); ``keep[b]`` the absolute frame boundaries (ascending, chunk multiples,
    each > starts[b] and <= starts[b] + lengths[b]) of the new segments to capture, one per interval.
    Returns (fp32 x [B, Tn, 80], the captured segments per row) as a generator's value: it pauses
    between two Euler steps (one ``next()`` a step, the last one returns), so a caller can run other
    work between them (:func:`run_steps` runs it whole).
    """
    dit = cfm.estimator
    batch, new, mel_dim = mu.shape
    device, dtype = mu.device, dit.modulation.weight.dtype
    modulation, dts = cfm.schedule(n_timesteps, device)
    guided = cfg_rate != 0.0
    copies = 2 if guided else 1
    mask = _attention_mask(
        starts, lengths, streaming, new, dit.cfg.static_chunk_size, copies, device, dtype
    )  # [R, 1, Tn, Tn + P]
    pos = torch.tensor(list(starts), device=device)[:, None] + torch.arange(new, device=device)  # [B, Tn]
    cos, sin = dit.rotary(max(starts) + new, device)  # [P + Tn, Dh]
    rope = (cos[pos].repeat(copies, 1, 1), sin[pos].repeat(copies, 1, 1))  # [R, Tn, Dh] each
    mu_in, cond_in, spk_in = mu.to(dtype), cond.to(dtype), spk.to(dtype)
    if guided:
        mu_in = torch.cat((mu_in, torch.zeros_like(mu_in)))  # [2B, Tn, 80]
        cond_in = torch.cat((cond_in, torch.zeros_like(cond_in)))
        spk_in = torch.cat((spk_in, torch.zeros_like(spk_in)))  # [2B, 80]
    cfg = dit.cfg
    buf_shape = (copies * batch, cfg.heads, new + max(starts), cfg.dim_head)
    # Keys laid out [new | cached], refilled per (step, block); not needed when nothing is cached (a fill).
    scratch = (mu_in.new_zeros(buf_shape), mu_in.new_zeros(buf_shape)) if max(starts) else None
    captures = _Captures(dit, starts, keep, n_timesteps, copies, mu_in)

    noise = cfm.noise_frames(max(starts) + new, device)  # [P + Tn, 80]
    x = noise[pos] * temperature  # [B, Tn, 80]
    for step in range(n_timesteps):
        if step:
            yield  # between two Euler steps
        x_in = torch.cat((x, x)) if guided else x
        v = _estimate(
            dit, x_in.to(dtype), mu_in, cond_in, spk_in, modulation[step : step + 1], rope, mask, step, past,
            scratch, captures,
        ).float()  # fmt: skip
        if guided:
            v_cond, v_uncond = v.split(batch)
            v = (1.0 + cfg_rate) * v_cond - cfg_rate * v_uncond
        x = x + dts[step] * v
    return x.float(), captures.rows


def solve_with_caches(*args: Any, **kwargs: Any) -> Tensor | None:
    """:func:`solve_with_caches_steps` run to its end."""
    return run_steps(solve_with_caches_steps(*args, **kwargs))


def solve_with_caches_steps(
    cfm: CausalCFM,
    cfg: FlowConfig,
    mu: Tensor,
    cond: Tensor,
    spk: Tensor,
    frames: Sequence[int],
    streaming: Sequence[bool],
    finalize: Sequence[bool],
    prompt_tokens: Sequence[int],
    prompt_frames: Sequence[int],
    caches: Sequence[FlowRowCache | None],
    skip: Sequence[int],
    *,
    n_timesteps: int,
    cfg_rate: float | None,
    temperature: float,
) -> Generator[None, None, Tensor | None]:
    """:meth:`Flow.inference`'s solve when rows carry caches; None when no row starts late or keeps chunks.

    mu, cond [B, T, 80] over every frame; returns fp32 [B, T, 80] with the frames each row skipped zero.
    Streaming rows start at the end of their usable cached segments (at most their first needed output
    frame, ``prompt_frames[b] + skip[b]``); non-final streaming rows keep their new complete chunks, split
    at the end of the prompt's voice-only chunks when the stream may offer them as its voice's prefix.
    A generator as :func:`solve_cached_steps` is (one ``next()`` an Euler step; None before any step).
    """
    dit = cfm.estimator
    chunk = dit.cfg.static_chunk_size
    if chunk <= 0 or dit.cfg.num_decoding_left_chunks >= 0 or chunk % cfg.token_mel_ratio:
        return None  # limited left context or odd chunks: nothing here is reusable as built
    rate = cfm.inference_cfg_rate if cfg_rate is None else float(cfg_rate)
    device, dtype = mu.device, dit.modulation.weight.dtype
    key = CacheKey(id(dit), n_timesteps, rate, float(temperature), dtype, device)
    ratio, lookahead = cfg.token_mel_ratio, cfg.pre_lookahead_len
    copies = 2 if rate != 0.0 else 1
    element = torch.empty((), dtype=dtype).element_size()
    batch = mu.shape[0]
    starts, past, keep, voice_ends = (
        [0] * batch,
        [[] for _ in range(batch)],
        [[] for _ in range(batch)],
        [0] * batch,
    )
    for b, cache in enumerate(caches):
        if cache is None or not streaming[b]:
            continue
        segments = cache.usable(key, prompt_frames[b] + skip[b])
        starts[b] = start = segments[-1].end if segments else 0
        past[b] = segments
        # Chunks whose tokens and look-ahead tokens are all prompt tokens depend on the voice only.
        voice_ends[b] = max(0, (prompt_tokens[b] - lookahead) * ratio // chunk) * chunk
        if finalize[b]:
            continue  # the closing call: nothing after it reads its chunks
        end = frames[b] // chunk * chunk  # complete chunks, every token's look-ahead known
        bounds = [voice_ends[b]] if cache.wants_voice_prefix and start < voice_ends[b] < end else []
        bounds += [end] if end > start else []
        while bounds:  # keep what fits, dropping the latest segments first
            cost = sum(
                segment_bytes(dit.cfg, e - a, n_timesteps=n_timesteps, copies=copies, element_size=element)
                for a, e in zip([start, *bounds[:-1]], bounds, strict=True)
            )
            if cache.room_for(cost):
                keep[b] = bounds
                break
            bounds = bounds[:-1]
    if not any(starts) and not any(keep):
        return None
    lengths = [f - s for f, s in zip(frames, starts, strict=True)]
    feat = torch.zeros(batch, mu.shape[1], mu.shape[-1], device=device, dtype=torch.float32)
    captured: list[list[ChunkSegment]] = [[] for _ in range(batch)]
    for group, rows in enumerate(row_groups(lengths, starts)):
        if group:
            yield  # between the last Euler step of one solve call and the first of the next
        pick = torch.tensor(rows, device=device)
        r_starts, r_lengths = [starts[b] for b in rows], [lengths[b] for b in rows]
        new, total = max(r_lengths), max(r_starts) + max(r_lengths)
        offset = torch.arange(new, device=device)
        pos = torch.tensor(r_starts, device=device)[:, None] + offset  # [G, Tn] absolute frames
        valid = (offset < torch.tensor(r_lengths, device=device)[:, None]).unsqueeze(-1)  # [G, Tn, 1]
        index = pos.unsqueeze(-1).expand(-1, -1, mu.shape[-1])
        zero = torch.zeros((), device=device, dtype=mu.dtype)
        mu_new, cond_new = (
            torch.where(valid, F.pad(t[pick], (0, 0, 0, max(0, total - t.shape[1]))).gather(1, index), zero)
            for t in (mu, cond)
        )  # [G, Tn, 80] each
        x, got = yield from solve_cached_steps(
            cfm, mu_new, cond_new, spk[pick], r_starts, r_lengths, [streaming[b] for b in rows],
            [past[b] for b in rows], [keep[b] for b in rows],
            n_timesteps=n_timesteps, cfg_rate=rate, temperature=temperature,
        )  # fmt: skip
        rows_feat = torch.zeros(len(rows), max(total, mu.shape[1]), x.shape[-1], device=device, dtype=torch.float32)
        rows_feat.scatter_(1, index, torch.where(valid, x, torch.zeros((), device=device, dtype=x.dtype)))
        feat[pick] = rows_feat[:, : mu.shape[1]]
        for b, segments in zip(rows, got, strict=True):
            captured[b] = segments
    for b, cache in enumerate(caches):
        if cache is not None and streaming[b] and not finalize[b]:
            cache.store(key, past[b], captured[b], voice_ends[b])
    return feat


def run_steps(steps: Generator[None, None, T]) -> T:
    """A stepping generator (``solve_cached_steps``, ``solve_with_caches_steps``) run to its end; its value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


PAD_SLACK = 1.25  # a group's padded frames may be at most this times its rows' own new frames


def row_groups(lengths: Sequence[int], starts: Sequence[int]) -> list[list[int]]:
    """Rows split into solve calls so that none is padded far past its own work.

    One call pads every row to the longest row's new frames: a cached hop of 100 new frames beside a
    closing full pass of 500 would compute 500 (the DiT's matrix multiplies, most of the work, scale
    with the frames). Rows sorted by new frames (longest first) join the current group while its padded
    frames stay within ``PAD_SLACK`` times its rows' own. Exact: each row's frames depend on that row
    alone.
    """
    order = sorted(range(len(lengths)), key=lambda b: (-lengths[b], -starts[b]))
    groups: list[list[int]] = []
    for b in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= PAD_SLACK * (
            sum(lengths[r] for r in groups[-1]) + lengths[b]
        ):
            groups[-1].append(b)
        else:
            groups.append([b])
    return [sorted(group) for group in groups]
