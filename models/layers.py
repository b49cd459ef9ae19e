"""Convolutions, shortcuts and the ways a unit joins its shortcut and residual branch.

Shortcut options A/B/C are from He et al. 2015, Sec. 3.3 and 4.1; the shortcut variants
(constant scaling, gating, 1x1 conv, dropout) are the ablations of He et al. 2016, Sec. 3.1
and Fig. 2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1 and no bias (a BatchNorm follows or precedes it)."""
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution with no bias."""
    return nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)


class ZeroPadShortcut(nn.Module):
    """Option A: identity, subsampled by the stride, with zero channels appended.

    Parameter-free; used by the 2015 CIFAR nets where the dimensions grow.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.extra_channels = out_channels - in_channels
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        if self.stride > 1:
            x = x[:, :, :: self.stride, :: self.stride]
        # F.pad's last pair addresses the channel dimension of an NCHW tensor here.
        return F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))

    def extra_repr(self) -> str:
        return f"extra_channels={self.extra_channels}, stride={self.stride}"


def projection(in_channels: int, out_channels: int, stride: int, *, norm: bool) -> nn.Sequential:
    """Options B/C: a strided 1x1 convolution, followed by BatchNorm in post-activation nets.

    Keys are `0.weight` (and `1.*` for the norm), as in torchvision's `downsample`.
    """
    layers: list[nn.Module] = [conv1x1(in_channels, out_channels, stride)]
    if norm:
        layers.append(nn.BatchNorm2d(out_channels))
    return nn.Sequential(*layers)


class Sum(nn.Module):
    """The original join: shortcut + residual."""

    def forward(self, gate_input: Tensor, shortcut: Tensor, residual: Tensor) -> Tensor:
        return shortcut + residual


class ConstantScaling(nn.Module):
    """lambda_s * shortcut + lambda_r * residual (2016 Fig. 2b)."""

    def __init__(self, shortcut_scale: float, residual_scale: float) -> None:
        super().__init__()
        self.shortcut_scale = shortcut_scale
        self.residual_scale = residual_scale

    def forward(self, gate_input: Tensor, shortcut: Tensor, residual: Tensor) -> Tensor:
        return self.shortcut_scale * shortcut + self.residual_scale * residual

    def extra_repr(self) -> str:
        return f"shortcut_scale={self.shortcut_scale}, residual_scale={self.residual_scale}"


class Gate(nn.Module):
    """g(x) = sigmoid(1x1 conv(x) + b_g), one gate value per output channel and position.

    `exclusive=True` is exclusive gating, (1 - g) * shortcut + g * residual (2016 Fig. 2c);
    `exclusive=False` is shortcut-only gating, (1 - g) * shortcut + residual (Fig. 2d).
    A very negative bias starts the gate nearly closed, so the unit starts near identity.
    """

    def __init__(
        self, in_channels: int, out_channels: int, stride: int, *, bias: float, exclusive: bool
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=True)
        self.initial_bias = bias
        self.exclusive = exclusive

    def reset_bias(self) -> None:
        """Set the gate's bias to its configured start value (after the net's init)."""
        bias = self.conv.bias
        assert bias is not None  # created with bias=True
        nn.init.constant_(bias, self.initial_bias)

    def forward(self, gate_input: Tensor, shortcut: Tensor, residual: Tensor) -> Tensor:
        g = torch.sigmoid(self.conv(gate_input))
        return (1 - g) * shortcut + (g * residual if self.exclusive else residual)

    def extra_repr(self) -> str:
        return f"exclusive={self.exclusive}, initial_bias={self.initial_bias}"


class DropoutShortcut(nn.Module):
    """Dropout on the shortcut: dropout(shortcut) + residual (2016 Fig. 2f)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, gate_input: Tensor, shortcut: Tensor, residual: Tensor) -> Tensor:
        dropped: Tensor = self.dropout(shortcut)
        return dropped + residual
