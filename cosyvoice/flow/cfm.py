"""Conditional flow matching solver of CosyVoice3 (official `CausalConditionalCFM` numerics).

* Noise is not drawn per call: a fixed buffer ``randn(1, 80, 15000)`` from a CPU generator seeded with 0
  (what the official constructor makes after reseeding every RNG with 0) is indexed from frame 0 of the
  prompt+target sequence, for every request, row and streaming hop. Our own generator is used, so the
  global RNG is left untouched.
* t follows ``1 - cos(linspace(0, 1, S + 1) * pi / 2)``; Euler steps accumulate ``t += dt`` and recompute
  ``dt = t_span[k + 1] - t`` (reproduced exactly, in fp32, on the CPU).
* Classifier-free guidance doubles the batch: rows [cond..., uncond...] share x and t, the uncond rows
  have mu, spk and cond zeroed; ``v = (1 + r) * v_cond - r * v_uncond``. With r == 0 the uncond half is
  skipped (same result, half the work).

Tensors are [B, T, 80] (time-major). The Euler state and the result are fp32 whatever the estimator dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import NOISE_FRAMES, NOISE_SEED
from .dit import DiT, attention_mask
from .errors import FlowInputError


def fixed_noise(mel_dim: int = 80, num_frames: int = NOISE_FRAMES, seed: int = NOISE_SEED) -> Tensor:
    """The official fixed CFM noise [1, mel_dim, num_frames], fp32 on the CPU (first values -1.1258, -1.1524)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(1, mel_dim, num_frames, generator=generator, dtype=torch.float32)


def euler_schedule(n_timesteps: int, t_scheduler: str = "cosine") -> tuple[Tensor, Tensor]:
    """(t, dt), each fp32 [n_timesteps] on the CPU: the time and step size used by each Euler step."""
    if n_timesteps < 1:
        raise FlowInputError(f"n_timesteps must be >= 1, got {n_timesteps}")
    if t_scheduler not in ("cosine", "linear"):
        raise FlowInputError(f"unknown t_scheduler {t_scheduler!r}")
    t_span = torch.linspace(0, 1, n_timesteps + 1, dtype=torch.float32)
    if t_scheduler == "cosine":
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
    t, dt = t_span[0], t_span[1] - t_span[0]
    ts, dts = [], []
    for step in range(1, n_timesteps + 1):
        ts.append(t)
        dts.append(dt)
        t = t + dt
        if step < n_timesteps:
            dt = t_span[step + 1] - t
    return torch.stack(ts), torch.stack(dts)


class CausalCFM(nn.Module):
    """Euler ODE solver around a :class:`DiT` estimator, batched over right-padded rows."""

    def __init__(
        self,
        estimator: DiT,
        *,
        inference_cfg_rate: float = 0.7,
        t_scheduler: str = "cosine",
        noise_frames: int = NOISE_FRAMES,
        noise_seed: int = NOISE_SEED,
    ) -> None:
        super().__init__()
        self.estimator = estimator
        self.inference_cfg_rate = inference_cfg_rate
        self.t_scheduler = t_scheduler
        # Plain attribute, not a buffer: it must stay fp32 when the module is cast to fp16/bf16.
        self.noise = fixed_noise(estimator.cfg.mel_dim, noise_frames, noise_seed)  # [1, 80, N]
        self._noise_by_device: dict[torch.device, Tensor] = {}
        self._schedule_cache: dict[tuple, tuple[Tensor, Tensor]] = {}
        # Time axis of every solve padded up to a multiple of this many frames (capped at the noise
        # buffer): few distinct shapes for a compiled estimator. 1 = no padding (eager default).
        self.frame_multiple = 1

    def padded_frames(self, num_frames: int) -> int:
        """The time axis a solve over ``num_frames`` frames runs at (see ``frame_multiple``)."""
        multiple = self.frame_multiple
        if not isinstance(multiple, int) or isinstance(multiple, bool) or multiple < 1:
            raise FlowInputError(f"frame_multiple must be a positive int, got {multiple!r}")
        padded = -(-num_frames // multiple) * multiple
        return max(num_frames, min(padded, self.max_frames))

    @property
    def max_frames(self) -> int:
        return self.noise.shape[-1]

    def clear_caches(self) -> None:
        """Drop device copies of the noise and cached AdaLN schedules (call after changing weights)."""
        self._noise_by_device.clear()
        self._schedule_cache.clear()

    def noise_frames(self, num_frames: int, device: torch.device) -> Tensor:
        """Noise for frames 0..num_frames-1, time-major [T, 80] fp32 on ``device``."""
        if num_frames > self.max_frames:
            raise FlowInputError(
                f"sequence of {num_frames} frames exceeds the noise buffer ({self.max_frames})"
            )
        noise = self._noise_by_device.get(device)
        if noise is None:
            noise = self._noise_by_device.setdefault(
                device, self.noise[0].t().contiguous().to(device)
            )  # [N, 80]
        return noise[:num_frames]

    def schedule(self, n_timesteps: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """(AdaLN modulation [S, M] in the estimator dtype, dt [S] fp32) on ``device``, cached per key."""
        dtype = self.estimator.modulation.weight.dtype
        key = (n_timesteps, self.t_scheduler, device, dtype)
        cached = self._schedule_cache.get(key)
        if cached is None:
            t, dt = euler_schedule(n_timesteps, self.t_scheduler)
            with torch.inference_mode():
                modulation = self.estimator.time_modulation(t.to(device))  # [S, M]
            cached = self._schedule_cache.setdefault(key, (modulation, dt.to(device)))
        return cached

    def solve(
        self,
        mu: Tensor,
        cond: Tensor,
        spk: Tensor,
        lengths: Sequence[int],
        streaming: Sequence[bool],
        *,
        n_timesteps: int = 10,
        cfg_rate: float | None = None,
        temperature: float = 1.0,
    ) -> Tensor:
        """Integrate from the fixed noise to a mel.

        mu, cond [B, T, 80] (right-padded rows, valid frame counts ``lengths``, T >= max(lengths));
        spk [B, 80]; ``streaming`` per row picks the chunk attention mask. Returns fp32 [B, T, 80];
        frames past a row's length hold unspecified values.

        With ``frame_multiple`` > 1 the estimator runs on a time axis zero-padded to a multiple of it;
        padded frames are masked as keys and the conv positional embedding is causal, so valid frames see
        the same inputs (including noise frames 0..T-1) and the result is cut back to T.
        """
        state = self.begin(
            mu, cond, spk, lengths, streaming, n_timesteps=n_timesteps, cfg_rate=cfg_rate, temperature=temperature
        )
        self.advance(state)
        return state.result()

    def begin(
        self,
        mu: Tensor,
        cond: Tensor,
        spk: Tensor,
        lengths: Sequence[int],
        streaming: Sequence[bool],
        *,
        n_timesteps: int = 10,
        cfg_rate: float | None = None,
        temperature: float = 1.0,
    ) -> EulerSolve:
        """:meth:`solve` as a resumable state: nothing integrated yet (:meth:`advance` it, read
        ``result()``). The same operations in the same order as :meth:`solve`, however it is sliced."""
        batch, seq_len, mel_dim = mu.shape
        if cond.shape != mu.shape or spk.shape[0] != batch or spk.dim() != 2:
            raise FlowInputError(
                f"mu {tuple(mu.shape)}, cond {tuple(cond.shape)}, spk {tuple(spk.shape)} mismatch"
            )
        if len(lengths) != batch or len(streaming) != batch:
            raise FlowInputError(
                f"need {batch} lengths and streaming flags, got {len(lengths)}/{len(streaming)}"
            )
        if min(lengths) < 1 or max(lengths) > seq_len:
            raise FlowInputError(f"row lengths {list(lengths)} must lie in 1..{seq_len}")
        rate = self.inference_cfg_rate if cfg_rate is None else float(cfg_rate)
        dit = self.estimator
        device, dtype = mu.device, dit.modulation.weight.dtype
        modulation, dts = self.schedule(n_timesteps, device)
        out_len, seq_len = seq_len, self.padded_frames(seq_len)
        if seq_len > out_len:
            mu, cond = (F.pad(t, (0, 0, 0, seq_len - out_len)) for t in (mu, cond))  # [B, T_pad, 80]
        rope = dit.rotary(seq_len, device)
        guided = rate != 0.0
        copies = 2 if guided else 1
        mask = attention_mask(
            lengths,
            streaming,
            chunk_size=dit.cfg.static_chunk_size,
            num_left_chunks=dit.cfg.num_decoding_left_chunks,
            repeat=copies,
            seq_len=seq_len,
            device=device,
        )
        if mask is not None:  # additive form once per call (SDPA would convert a bool mask on every call)
            mask = torch.zeros(mask.shape, device=device, dtype=dtype).masked_fill_(~mask, float("-inf"))
        mu_in, cond_in, spk_in = mu.to(dtype), cond.to(dtype), spk.to(dtype)
        if guided:
            mu_in = torch.cat((mu_in, torch.zeros_like(mu_in)))  # [2B, T, 80]
            cond_in = torch.cat((cond_in, torch.zeros_like(cond_in)))  # [2B, T, 80]
            spk_in = torch.cat((spk_in, torch.zeros_like(spk_in)))  # [2B, 80]

        x = (self.noise_frames(seq_len, device) * temperature).expand(batch, seq_len, mel_dim)  # [B, T, 80]
        return EulerSolve(
            x=x, mu=mu_in, cond=cond_in, spk=spk_in, mask=mask, rope=rope, modulation=modulation, dts=dts,
            rate=rate, n_timesteps=n_timesteps, out_len=out_len,
        )  # fmt: skip

    def advance(self, state: EulerSolve, steps: int | None = None) -> bool:
        """Run the next ``steps`` Euler steps of ``state`` (None: all that are left); True once done."""
        dit = self.estimator
        dtype = dit.modulation.weight.dtype
        end = state.n_timesteps if steps is None else min(state.n_timesteps, state.step + steps)
        guided = state.rate != 0.0
        batch = state.x.shape[0]
        x = state.x
        for step in range(state.step, end):
            x_in = torch.cat((x, x)) if guided else x  # [copies * B, T, 80]
            v = dit(
                x_in.to(dtype), state.mu, state.cond, state.spk, state.modulation[step : step + 1], state.rope,
                state.mask,
            ).float()  # fmt: skip
            if guided:
                v_cond, v_uncond = v.split(batch)  # each [B, T, 80]
                v = (1.0 + state.rate) * v_cond - state.rate * v_uncond
            x = x + state.dts[step] * v
        state.x, state.step = x, end
        return state.done


@dataclass(eq=False)
class EulerSolve:
    """A solve under way (:meth:`CausalCFM.begin`): the Euler state and what every step reads."""

    x: Tensor  # [B, T, 80] fp32 after ``step`` steps
    mu: Tensor
    cond: Tensor
    spk: Tensor
    mask: Tensor | None
    rope: tuple[Tensor, Tensor]
    modulation: Tensor
    dts: Tensor
    rate: float
    n_timesteps: int
    out_len: int
    step: int = 0

    @property
    def done(self) -> bool:
        return self.step >= self.n_timesteps

    def result(self) -> Tensor:
        """The mel [B, T, 80] fp32 once every step ran."""
        if not self.done:
            raise FlowInputError(f"solve read after {self.step} of {self.n_timesteps} steps")
        return self.x[:, : self.out_len].float()
