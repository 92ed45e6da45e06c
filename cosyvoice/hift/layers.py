"""Convolution building blocks of the causal HiFT vocoder (weights already weight-norm folded).

Every conv keeps upstream's parameter names (``weight``, ``bias``; Snake ``alpha``) so a folded
``hift.pt`` state dict loads with ``load_state_dict``. All convs are stride-1 and padded on one side with
zeros, so an output frame never depends on input frames after it ('left') or on more than ``k - 1``
frames after it ('right', the look-ahead convs). Tensors are [B, C, T] throughout.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CausalConv1d", "DownsampleConv1d", "ResBlock", "Snake", "UpsampleConv1d"]


class CausalConv1d(nn.Module):
    """Conv1d with ``(k - 1) * dilation`` zeros on the left (causal) or on the right (look-ahead)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        dilation: int = 1,
        side: Literal["left", "right"] = "left",
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(out_channels, in_channels, kernel_size))  # [out, in, k]
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.dilation = dilation
        self.padding = (kernel_size - 1) * dilation
        self.pad = (self.padding, 0) if side == "left" else (0, self.padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, self.pad)  # [B, in, T + padding]
        return F.conv1d(x, self.weight, self.bias, dilation=self.dilation)  # [B, out, T]


class UpsampleConv1d(nn.Module):
    """Nearest-neighbour upsampling by ``rate``, then a causal conv (left zero padding ``k - 1``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, rate: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(out_channels, in_channels, kernel_size))  # [out, in, k]
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.rate = rate
        self.padding = kernel_size - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=float(self.rate), mode="nearest")  # [B, in, T * rate]
        x = F.pad(x, (self.padding, 0))  # [B, in, T * rate + k - 1]
        return F.conv1d(x, self.weight, self.bias)  # [B, out, T * rate]


class DownsampleConv1d(nn.Module):
    """Left zero padding ``rate - 1``, then a conv with kernel ``2 * rate`` and stride ``rate``."""

    def __init__(self, in_channels: int, out_channels: int, rate: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(out_channels, in_channels, 2 * rate))  # [out, in, 2 * rate]
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (self.rate - 1, 0))  # [B, in, T + rate - 1]
        return F.conv1d(x, self.weight, self.bias, stride=self.rate)  # [B, out, (T - rate - 1) // rate + 1]


class Snake(nn.Module):
    """Snake activation ``x + sin(alpha * x)^2 / (alpha + 1e-9)`` with a linear-scale alpha per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]  # [1, C, 1]
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """Per dilation d: ``x += conv_k(snake(conv_k,d(snake(x))))``, all convs causal."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            CausalConv1d(channels, channels, kernel_size, dilation=d) for d in dilations
        )
        self.convs2 = nn.ModuleList(CausalConv1d(channels, channels, kernel_size) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv1, conv2, act1, act2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = conv2(act2(conv1(act1(x)))) + x  # [B, C, T]
        return x
