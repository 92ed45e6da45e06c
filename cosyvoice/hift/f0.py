"""The causal f0 predictor, always evaluated in float64 (upstream casts module and mel to float64).

``condnet``: a look-ahead conv (k=4, 3 frames to the right), then four causal convs (k=3), each followed
by ELU; then ``Linear(cond, num_class)`` and ``abs``. Its parameters stay float64 whatever dtype the rest
of the vocoder is cast to: :meth:`F0Predictor._apply` only follows device moves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from cosyvoice.hift.layers import CausalConv1d

__all__ = ["F0_DTYPE", "F0Predictor"]

F0_DTYPE = torch.float64


class F0Predictor(nn.Module):
    look_ahead = 3  # frames of right context of condnet[0] (kernel 4)

    def __init__(self, in_channels: int, cond_channels: int, num_class: int = 1) -> None:
        super().__init__()
        # Indices 0, 2, 4, 6, 8 match upstream's nn.Sequential with ELUs at the odd positions.
        convs: list[nn.Module] = [CausalConv1d(in_channels, cond_channels, 4, side="right"), nn.ELU()]
        for _ in range(4):
            convs += [CausalConv1d(cond_channels, cond_channels, 3), nn.ELU()]
        self.condnet = nn.Sequential(*convs)
        self.classifier = nn.Linear(cond_channels, num_class)
        self.to(F0_DTYPE)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> nn.Module:
        device = fn(torch.empty(0, dtype=F0_DTYPE)).device  # where .to()/.cuda()/.half() wants us
        return super()._apply(lambda t: t.to(device=device, dtype=F0_DTYPE), recurse)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, C, T] (any float dtype) -> f0 [B, T] float64; frames near the end see zero look-ahead."""
        x = self.condnet(mel.to(F0_DTYPE))  # [B, cond, T]
        x = self.classifier(x.transpose(1, 2))  # [B, T, num_class]
        return torch.abs(x[..., 0])  # [B, T]  (num_class is 1 in every release)
