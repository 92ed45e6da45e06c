"""CosyVoice3 flow: speech tokens -> 80-bin mel at 50 frames/s (official `CausalMaskedDiffWithDiT`).

Public API (what token2wav and the engine call)::

    flow = Flow.from_pretrained(model_dir)            # reads model_dir/flow.pt (or a .pt path)
    flow.to(device)                                   # optionally .to(torch.bfloat16) etc.
    mel = flow.inference(
        token, token_len,                             # [B, N] int, [B] (Tensor or list of int)
        prompt_token, prompt_token_len,               # [B, P] int, [B]  (P may be 0)
        prompt_feat, prompt_feat_len,                 # [B, F, 80] float, [B]  (prompt mel, time-major)
        embedding,                                    # [B, 192] speaker x-vector (normalised inside)
        streaming=False,                              # bool or per-row: 50-frame chunk mask vs full attention
        finalize=True,                                # bool or per-row: False = last 3 tokens are look-ahead only
        n_timesteps=10, cfg_rate=None, temperature=1.0,
    )                                                 # -> fp32 [B, 80, M_max], zeros past each row's M_b
    flow.mel_lengths(token_len, prompt_token_len, prompt_feat_len, finalize)   # -> [M_b] (host ints)

Rows are right-padded; row b uses ``prompt_token[b, :P_b] ++ token[b, :N_b]`` and its output equals a
batch-1 call on that row alone. M_b = 2 * (P_b + N_b - (0 if finalize else 3)) - F_b: the frames after the
F_b prompt frames. A streaming hop of the official loop is ``inference(tokens[:, :offset + hop + 3],
streaming=True, finalize=False)[:, :, 2 * offset:]``; the closing call uses streaming=False, finalize=True
(see docs/cosyvoice.md §7). The flow keeps no per-request state.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cfm import CausalCFM, EulerSolve
from .chunk_cache import FlowRowCache
from .config import CFMConfig, FlowConfig
from .dit import DiT
from .errors import FlowInputError
from .incremental import solve_with_caches_steps
from .solve import FlowSolve, Prepared
from .weights import (
    ESTIMATOR_PREFIX,
    StateDictReader,
    copy_conv,
    copy_linear,
    dit_config_from_state_dict,
    load_dit_weights,
    load_flow_state_dict,
)

LEAKY_SLOPE = 0.01


class PreLookaheadLayer(nn.Module):
    """conv1 (kernel L+1) over each token and its next L tokens, leaky ReLU, causal conv2 (kernel 3), residual."""

    def __init__(self, channels_in: int, channels: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels_in, channels, lookahead + 1)
        self.conv2 = nn.Conv1d(channels, channels_in, 3)

    def forward(self, x: Tensor) -> Tensor:
        """x [B, N, C], zero past each row's valid tokens -> [B, N, C].

        Position i reads x[i .. i+L] (zeros past the end), which covers both official modes: with
        finalize the right context is zero padding; without it the row's last L tokens serve as context
        and only its first N_b - L outputs are meaningful.
        """
        y = x.transpose(1, 2)  # [B, C, N]
        y = F.leaky_relu(self.conv1(F.pad(y, (0, self.lookahead))), LEAKY_SLOPE)  # [B, H, N]
        y = self.conv2(F.pad(y, (self.conv2.kernel_size[0] - 1, 0)))  # [B, C, N]
        return y.transpose(1, 2) + x  # [B, N, C]


def _row_ints(value: Tensor | Sequence[int], batch: int, name: str) -> list[int]:
    values = value.tolist() if isinstance(value, Tensor) else list(value)
    if len(values) != batch or any(not isinstance(v, int) or v < 0 for v in values):
        raise FlowInputError(f"{name} must hold {batch} non-negative ints, got {values}")
    return values


def _any_id_at_least(ids: Tensor, lengths: list[int], limit: int) -> bool:
    """Whether a row's first ``lengths[b]`` ids hold one >= ``limit`` (computed on ``ids``' device)."""
    valid = torch.arange(ids.shape[1], device=ids.device) < torch.tensor(lengths, device=ids.device)[:, None]
    return bool(((ids >= limit) & valid).any())


def _row_flags(value: bool | Tensor | Sequence[bool], batch: int, name: str) -> list[bool]:
    if isinstance(value, bool):
        return [value] * batch
    flags = value.tolist() if isinstance(value, Tensor) else list(value)
    if len(flags) != batch:
        raise FlowInputError(f"{name} must be a bool or {batch} bools, got {flags}")
    return [bool(f) for f in flags]


class Flow(nn.Module):
    """Token embedding, speaker affine, pre-lookahead, 2x upsampling and the CFM/DiT decoder."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.mel_dim)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.mel_dim)
        self.pre_lookahead_layer = PreLookaheadLayer(
            cfg.mel_dim, cfg.pre_lookahead_channels, cfg.pre_lookahead_len
        )
        cfm = cfg.cfm
        self.decoder = CausalCFM(
            DiT(cfg.dit),
            inference_cfg_rate=cfm.inference_cfg_rate,
            t_scheduler=cfm.t_scheduler,
            noise_frames=cfm.noise_frames,
            noise_seed=cfm.noise_seed,
        )

    @classmethod
    def from_state_dict(
        cls,
        state: dict[str, Tensor],
        *,
        source: str = "flow.pt",
        static_chunk_size: int = 50,
        num_decoding_left_chunks: int = -1,
        token_mel_ratio: int = 2,
        inference_cfg_rate: float = 0.7,
    ) -> Flow:
        """Build from an official state dict; sizes come from the tensors, the rest from the arguments
        (yaml: ``chunk_size * token_mel_ratio``, ``num_decoding_left_chunks``, ``token_mel_ratio``)."""
        reader = StateDictReader(state, source)
        dit_cfg = dit_config_from_state_dict(
            state,
            source=source,
            static_chunk_size=static_chunk_size,
            num_decoding_left_chunks=num_decoding_left_chunks,
        )
        vocab_size, mel_dim = reader.shape("input_embedding.weight")
        channels, _, kernel = reader.shape("pre_lookahead_layer.conv1.weight")
        cfg = FlowConfig(
            dit=dit_cfg,
            vocab_size=vocab_size,
            mel_dim=mel_dim,
            spk_embed_dim=reader.shape("spk_embed_affine_layer.weight")[1],
            pre_lookahead_channels=channels,
            pre_lookahead_len=kernel - 1,
            token_mel_ratio=token_mel_ratio,
            cfm=CFMConfig(inference_cfg_rate=inference_cfg_rate),
        )
        flow = cls(cfg)
        with torch.no_grad():
            flow.input_embedding.weight.copy_(reader.get("input_embedding.weight", (vocab_size, mel_dim)))
        copy_linear(reader, "spk_embed_affine_layer", flow.spk_embed_affine_layer)
        copy_conv(reader, "pre_lookahead_layer.conv1", flow.pre_lookahead_layer.conv1)
        copy_conv(reader, "pre_lookahead_layer.conv2", flow.pre_lookahead_layer.conv2)
        load_dit_weights(flow.decoder.estimator, reader, ESTIMATOR_PREFIX)
        reader.check_all_used()
        return flow.eval()

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> Flow:
        """Load ``path/flow.pt`` (or the file ``path``); kwargs as :meth:`from_state_dict`."""
        path = Path(path)
        file = path / "flow.pt" if path.is_dir() else path
        return cls.from_state_dict(load_flow_state_dict(file), source=str(file), **kwargs)

    def mel_lengths(
        self,
        token_len: Tensor | Sequence[int],
        prompt_token_len: Tensor | Sequence[int],
        prompt_feat_len: Tensor | Sequence[int],
        finalize: bool | Tensor | Sequence[bool] = True,
    ) -> list[int]:
        """Output frames per row: ratio * (P_b + N_b - (0 if finalize else L)) - F_b."""
        batch = len(token_len)
        n = _row_ints(token_len, batch, "token_len")
        p = _row_ints(prompt_token_len, batch, "prompt_token_len")
        f = _row_ints(prompt_feat_len, batch, "prompt_feat_len")
        fin = _row_flags(finalize, batch, "finalize")
        la, ratio = self.cfg.pre_lookahead_len, self.cfg.token_mel_ratio
        return [ratio * (p[b] + n[b] - (0 if fin[b] else la)) - f[b] for b in range(batch)]

    @torch.inference_mode()
    def inference(
        self,
        token: Tensor,
        token_len: Tensor | Sequence[int],
        prompt_token: Tensor,
        prompt_token_len: Tensor | Sequence[int],
        prompt_feat: Tensor,
        prompt_feat_len: Tensor | Sequence[int],
        embedding: Tensor,
        streaming: bool | Tensor | Sequence[bool] = False,
        finalize: bool | Tensor | Sequence[bool] = True,
        n_timesteps: int | None = None,
        cfg_rate: float | None = None,
        temperature: float = 1.0,
        *,
        caches: Sequence[FlowRowCache | None] | None = None,
        skip_frames: Sequence[int] | None = None,
    ) -> Tensor:
        """Mel [B, 80, M_max] (fp32) for each row's tokens after its prompt; see the module docstring.

        ``caches`` (per row, or None) makes streaming rows start from their cached complete chunks and
        keep the new complete chunks (non-final rows) for the next call; ``skip_frames[b]`` output
        frames of row b are not needed by the caller (they are returned as zeros when a cache let the
        row skip them). Results equal the uncached call up to floating point rounding.
        """
        solve = self.begin_inference(
            token, token_len, prompt_token, prompt_token_len, prompt_feat, prompt_feat_len, embedding, streaming,
            finalize, n_timesteps, cfg_rate, temperature, caches=caches, skip_frames=skip_frames,
        )  # fmt: skip
        self.advance_inference(solve)
        return self.finish_inference(solve)

    @torch.inference_mode()
    def begin_inference(
        self,
        token: Tensor,
        token_len: Tensor | Sequence[int],
        prompt_token: Tensor,
        prompt_token_len: Tensor | Sequence[int],
        prompt_feat: Tensor,
        prompt_feat_len: Tensor | Sequence[int],
        embedding: Tensor,
        streaming: bool | Tensor | Sequence[bool] = False,
        finalize: bool | Tensor | Sequence[bool] = True,
        n_timesteps: int | None = None,
        cfg_rate: float | None = None,
        temperature: float = 1.0,
        *,
        caches: Sequence[FlowRowCache | None] | None = None,
        skip_frames: Sequence[int] | None = None,
    ) -> FlowSolve:
        """:meth:`inference` as a resumable solve: :meth:`advance_inference` runs its Euler steps a few at a
        time (another request's work can go between them), :meth:`finish_inference` gives the mel. The
        same operations as one :meth:`inference` call, however it is sliced."""
        prep = self._prepare(
            token, token_len, prompt_token, prompt_token_len, prompt_feat, prompt_feat_len, embedding, streaming,
            finalize,
        )  # fmt: skip
        steps = self.cfg.n_timesteps if n_timesteps is None else n_timesteps
        if caches is None:
            return FlowSolve(prep, self._euler(prep, steps, cfg_rate, temperature))
        skip = [0] * prep.batch if skip_frames is None else _row_ints(skip_frames, prep.batch, "skip_frames")
        return FlowSolve(prep, None, self._cached_steps(prep, list(caches), skip, steps, cfg_rate, temperature))

    def _euler(self, prep: Prepared, steps: int, cfg_rate: float | None, temperature: float) -> EulerSolve:
        return self.decoder.begin(
            prep.mu, prep.cond, prep.spk, prep.frames, prep.stream, n_timesteps=steps, cfg_rate=cfg_rate,
            temperature=temperature,
        )  # fmt: skip

    def _cached_steps(
        self,
        prep: Prepared,
        caches: list[FlowRowCache | None],
        skip: list[int],
        steps: int,
        cfg_rate: float | None,
        temperature: float,
    ) -> Generator[None, None, Tensor]:
        """The solve with caches, one ``next()`` an Euler step (the plain one where no cache serves)."""
        feat = yield from solve_with_caches_steps(
            self.decoder, self.cfg, prep.mu, prep.cond, prep.spk, prep.frames, prep.stream, prep.fin,
            prep.p_len, prep.f_len, caches, skip, n_timesteps=steps, cfg_rate=cfg_rate, temperature=temperature,
        )  # fmt: skip
        if feat is None:
            euler = self._euler(prep, steps, cfg_rate, temperature)
            while not self.decoder.advance(euler, 1):
                yield
            feat = euler.result()  # [B, T, 80] fp32
        return feat

    @torch.inference_mode()
    def advance_inference(self, solve: FlowSolve, steps: int | None = None) -> bool:
        """Run ``steps`` more Euler steps of ``solve`` (None: the rest); True once it is done."""
        if solve.euler is not None:
            return self.decoder.advance(solve.euler, steps)
        left = -1 if steps is None else steps
        while solve.feat is None and left != 0 and solve.steps is not None:
            try:
                next(solve.steps)
            except StopIteration as stop:
                solve.feat = stop.value
            left -= 1
        return solve.done

    @torch.inference_mode()
    def finish_inference(self, solve: FlowSolve) -> Tensor:
        """The mel [B, 80, M_max] of a done solve, as :meth:`inference` returns it."""
        if solve.euler is not None:
            return self._output(solve.prep, solve.euler.result())
        if solve.feat is None:
            raise FlowInputError("a flow solve was read before its last Euler step")
        return self._output(solve.prep, solve.feat)

    def _prepare(
        self,
        token: Tensor,
        token_len: Tensor | Sequence[int],
        prompt_token: Tensor,
        prompt_token_len: Tensor | Sequence[int],
        prompt_feat: Tensor,
        prompt_feat_len: Tensor | Sequence[int],
        embedding: Tensor,
        streaming: bool | Tensor | Sequence[bool],
        finalize: bool | Tensor | Sequence[bool],
    ) -> Prepared:
        """Checks, then the solve's inputs (mu, cond, spk) and what the output gather needs."""
        cfg = self.cfg
        if token.dim() != 2 or prompt_token.dim() != 2 or token.shape[0] != prompt_token.shape[0]:
            raise FlowInputError(
                f"token {tuple(token.shape)} / prompt_token {tuple(prompt_token.shape)}: need [B, N]"
            )
        if token.is_floating_point() or prompt_token.is_floating_point():
            raise FlowInputError("token and prompt_token must be integer tensors")
        batch = token.shape[0]
        if prompt_feat.dim() != 3 or prompt_feat.shape[0] != batch or prompt_feat.shape[2] != cfg.mel_dim:
            raise FlowInputError(f"prompt_feat {tuple(prompt_feat.shape)}: need [{batch}, F, {cfg.mel_dim}]")
        if embedding.shape != (batch, cfg.spk_embed_dim):
            raise FlowInputError(f"embedding {tuple(embedding.shape)}: need [{batch}, {cfg.spk_embed_dim}]")
        n_len = _row_ints(token_len, batch, "token_len")
        p_len = _row_ints(prompt_token_len, batch, "prompt_token_len")
        f_len = _row_ints(prompt_feat_len, batch, "prompt_feat_len")
        stream = _row_flags(streaming, batch, "streaming")
        fin = _row_flags(finalize, batch, "finalize")
        la, ratio = cfg.pre_lookahead_len, cfg.token_mel_ratio
        if (
            max(n_len) > token.shape[1]
            or max(p_len) > prompt_token.shape[1]
            or max(f_len) > prompt_feat.shape[1]
        ):
            raise FlowInputError("a row length exceeds its padded tensor")
        if any(not f and n < la for n, f in zip(n_len, fin, strict=True)):
            raise FlowInputError(f"a non-final call needs at least {la} tokens per row (look-ahead)")
        tok_len = [p + n for p, n in zip(p_len, n_len, strict=True)]
        frames = [ratio * (t - (0 if f else la)) for t, f in zip(tok_len, fin, strict=True)]
        if min(tok_len) < 1:
            raise FlowInputError("every row needs at least one prompt or target token")
        if any(f > t for f, t in zip(f_len, frames, strict=True)):
            raise FlowInputError(f"prompt mel frames {f_len} exceed the sequence frames {frames}")
        if max(frames) > self.decoder.max_frames:
            raise FlowInputError(f"{max(frames)} frames exceed the flow limit of {self.decoder.max_frames}")
        # Checked where the ids live, before any copy: host tensors (token2wav's) cost no device sync.
        if _any_id_at_least(token, n_len, cfg.vocab_size) or _any_id_at_least(
            prompt_token, p_len, cfg.vocab_size
        ):
            raise FlowInputError(
                f"speech token id >= vocab size {cfg.vocab_size} (stop tokens never feed the flow)"
            )

        device = self.input_embedding.weight.device
        dtype = self.input_embedding.weight.dtype
        # Per-row concatenation prompt[:P_b] ++ token[:N_b] by one gather: [B, Lmax].
        l_max, p_pad = max(tok_len), prompt_token.shape[1]
        pos = torch.arange(l_max, device=device).unsqueeze(0)  # [1, Lmax]
        p_b = torch.tensor(p_len, device=device).unsqueeze(1)  # [B, 1]
        valid = pos < torch.tensor(tok_len, device=device).unsqueeze(1)  # [B, Lmax]
        both = torch.cat((prompt_token.to(device), token.to(device)), dim=1)  # [B, P + N]
        index = torch.where(pos < p_b, pos, pos - p_b + p_pad).clamp(max=both.shape[1] - 1)  # [B, Lmax]
        ids = both.gather(1, index)  # [B, Lmax]
        ids = ids.clamp(0, cfg.vocab_size - 1)  # padding may hold any id: it is zeroed right after
        # Padding is dropped with where(), never multiplied by a 0/1 mask: 0 * inf or 0 * nan in a padded
        # slot would otherwise leak into the row (right-padded rows must not depend on their padding).
        zero = torch.zeros((), device=device, dtype=dtype)
        emb = torch.where(valid.unsqueeze(-1), self.input_embedding(ids), zero)  # [B, Lmax, 80]

        h = self.pre_lookahead_layer(emb)  # [B, Lmax, 80]
        t_max = max(frames)
        mu = h.repeat_interleave(ratio, dim=1)[:, :t_max]  # [B, T, 80]
        frame_pos = torch.arange(t_max, device=device).unsqueeze(0)  # [1, T]
        mu = torch.where((frame_pos < torch.tensor(frames, device=device).unsqueeze(1)).unsqueeze(-1), mu, zero)
        f_b = torch.tensor(f_len, device=device).unsqueeze(1)  # [B, 1]
        cond = torch.zeros(batch, t_max, cfg.mel_dim, device=device, dtype=dtype)  # [B, T, 80]
        n_prompt = min(prompt_feat.shape[1], t_max)
        cond[:, :n_prompt] = prompt_feat[:, :n_prompt].to(device, dtype)
        cond = torch.where((frame_pos < f_b).unsqueeze(-1), cond, zero)  # prompt padding never read

        spk = self.spk_embed_affine_layer(F.normalize(embedding.to(device, dtype), dim=1))  # [B, 80]
        # Output row mask built before the solve, so no host-to-device copy waits for the Euler loop.
        out_len = [t - f for t, f in zip(frames, f_len, strict=True)]
        out_pos = torch.arange(max(out_len), device=device).unsqueeze(0)  # [1, Mmax]
        out_valid = (out_pos < torch.tensor(out_len, device=device)[:, None])[:, :, None]  # [B, Mmax, 1]
        return Prepared(
            batch=batch, mu=mu, cond=cond, spk=spk, frames=frames, stream=stream, fin=fin, p_len=p_len,
            f_len=f_len, out_pos=out_pos, out_valid=out_valid, f_b=f_b, t_max=t_max,
        )  # fmt: skip

    def _output(self, prep: Prepared, feat: Tensor) -> Tensor:
        """Row b's output is frames F_b .. frames_b - 1: [B, 80, Mmax] by one gather, zero past M_b."""
        index = (prep.out_pos + prep.f_b).clamp(max=prep.t_max - 1)  # [B, Mmax]
        mel = feat.gather(1, index.unsqueeze(-1).expand(-1, -1, self.cfg.mel_dim))  # [B, Mmax, 80]
        mel = torch.where(prep.out_valid, mel, torch.zeros((), device=mel.device, dtype=mel.dtype))
        return mel.transpose(1, 2).contiguous()  # [B, 80, Mmax]
