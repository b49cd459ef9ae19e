"""Residual units: basic (two 3x3 convs) and bottleneck (1x1, 3x3, 1x1), in every wiring.

A unit computes post(join(shortcut(s), residual(pre(x)))) where the placement of BN and
ReLU follows the chosen unit type (He et al. 2016, Fig. 4):

| unit             | pre     | residual branch                 | post      |
|------------------|---------|---------------------------------|-----------|
| original         | -       | conv-BN-ReLU ... conv-BN        | ReLU      |
| bn_after_add     | -       | conv-BN-ReLU ... conv           | BN-ReLU   |
| relu_before_add  | -       | conv-BN-ReLU ... conv-BN-ReLU   | -         |
| relu_only_preact | ReLU    | conv-BN-ReLU ... conv-BN        | -         |
| full_preact      | BN-ReLU | conv ... BN-ReLU-conv           | -         |

Submodules are named as in torchvision (`conv1`, `bn1`, ..., `downsample`), so the original
ImageNet nets load torchvision state_dicts. A unit that changes dimensions feeds its
shortcut the pre-activated input, as in the authors' pre-activation code; the first unit of
a pre-activation net skips its own pre-activation because the stem already applied one.
"""

from __future__ import annotations

from torch import Tensor, nn

from models.config import UnitConfig
from models.layers import (
    ConstantScaling,
    DropoutShortcut,
    Gate,
    Sum,
    ZeroPadShortcut,
    conv1x1,
    conv3x3,
    projection,
)


def _op_order(unit: str, n_convs: int, preactivate: bool) -> tuple[tuple[str, ...], ...]:
    """Names of the submodules run before the branch, in the branch, and after the join."""
    convs = [f"conv{i}" for i in range(1, n_convs + 1)]
    bns = [f"bn{i}" for i in range(1, n_convs + 1)]
    post_act = [op for c, b in zip(convs, bns, strict=True) for op in (c, b, "relu")][:-1]
    pre: list[str] = []
    post: list[str] = []
    if unit == "original":
        branch, post = post_act, ["relu"]
    elif unit == "bn_after_add":
        branch, post = post_act[:-1], [bns[-1], "relu"]
    elif unit == "relu_before_add":
        branch = [*post_act, "relu"]
    elif unit == "relu_only_preact":
        pre, branch = ["relu"], post_act
    else:  # full_preact
        pre = [bns[0], "relu"]
        branch = [op for c, b in zip(convs, bns, strict=True) for op in (b, "relu", c)][2:]
    return tuple(pre if preactivate else ()), tuple(branch), tuple(post)


def _make_shortcut(
    in_channels: int, out_channels: int, stride: int, cfg: UnitConfig
) -> nn.Module | None:
    """The shortcut path h(x); None means the plain identity."""
    changes_shape = stride != 1 or in_channels != out_channels
    # Pre-activation nets project without BN (the BN-ReLU before the unit normalises already).
    norm = not cfg.preact
    if cfg.shortcut_variant == "conv1x1":
        return projection(in_channels, out_channels, stride, norm=False)
    if cfg.shortcut == "C" or (changes_shape and cfg.shortcut == "B"):
        return projection(in_channels, out_channels, stride, norm=norm)
    if changes_shape:
        return ZeroPadShortcut(in_channels, out_channels, stride)
    return None


def _make_join(in_channels: int, out_channels: int, stride: int, cfg: UnitConfig) -> nn.Module:
    """How the shortcut and the residual branch are added (2016 Fig. 2)."""
    variant = cfg.shortcut_variant
    if variant == "constant_scaling":
        return ConstantScaling(cfg.shortcut_scale, cfg.residual_scale)
    if variant in ("exclusive_gating", "shortcut_only_gating"):
        exclusive = variant == "exclusive_gating"
        return Gate(in_channels, out_channels, stride, bias=cfg.gate_bias, exclusive=exclusive)
    if variant == "dropout":
        return DropoutShortcut(cfg.shortcut_dropout)
    return Sum()


class ResidualUnit(nn.Module):
    """Shared forward of basic and bottleneck units; subclasses create the convolutions."""

    expansion = 1
    n_convs = 2

    def __init__(
        self,
        in_channels: int,
        planes: int,
        stride: int = 1,
        cfg: UnitConfig | None = None,
        *,
        preactivate: bool = True,
    ) -> None:
        super().__init__()
        cfg = cfg or UnitConfig()
        out_channels = planes * self.expansion
        self.pre_ops, self.branch_ops, self.post_ops = _op_order(
            cfg.unit, self.n_convs, preactivate
        )
        used = {*self.pre_ops, *self.branch_ops, *self.post_ops}
        # Registered conv1, bn1, conv2, ... so that state_dict order is torchvision's.
        for i, conv in enumerate(self._convs(in_channels, planes, stride, cfg), start=1):
            setattr(self, f"conv{i}", conv)
            if f"bn{i}" in used:
                # A BN before its conv (pre-activation) sees the conv's input channels.
                channels = conv.in_channels if cfg.unit == "full_preact" else conv.out_channels
                setattr(self, f"bn{i}", nn.BatchNorm2d(channels))
        self.relu = nn.ReLU(inplace=False)
        # A plain unit (no shortcut) has neither a shortcut path nor a join.
        self.downsample = (
            _make_shortcut(in_channels, out_channels, stride, cfg) if cfg.residual else None
        )
        self.join = _make_join(in_channels, out_channels, stride, cfg) if cfg.residual else None
        # Parameter-free tap on F(x) before the join: diagnostics hook it (2015 Fig. 7).
        self.branch_out = nn.Identity()
        self.shortcut_from_pre = stride != 1 or in_channels != out_channels

    def _convs(
        self, in_channels: int, planes: int, stride: int, cfg: UnitConfig
    ) -> list[nn.Conv2d]:
        raise NotImplementedError

    def _run(self, ops: tuple[str, ...], x: Tensor) -> Tensor:
        for name in ops:
            x = getattr(self, name)(x)
        return x

    def last_branch_layer(self) -> nn.Conv2d | nn.BatchNorm2d:
        """The last conv or BN of the residual branch (zeroed by `zero_init_residual`)."""
        layer = getattr(self, next(op for op in reversed(self.branch_ops) if op != "relu"))
        assert isinstance(layer, nn.Conv2d | nn.BatchNorm2d)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        pre = self._run(self.pre_ops, x)
        residual = self.branch_out(self._run(self.branch_ops, pre))
        if self.join is None:
            return self._run(self.post_ops, residual)
        shortcut_in = pre if self.shortcut_from_pre else x
        shortcut = shortcut_in if self.downsample is None else self.downsample(shortcut_in)
        return self._run(self.post_ops, self.join(shortcut_in, shortcut, residual))


class BasicBlock(ResidualUnit):
    """Two 3x3 convolutions; the first one strides."""

    expansion = 1
    n_convs = 2

    def _convs(
        self, in_channels: int, planes: int, stride: int, cfg: UnitConfig
    ) -> list[nn.Conv2d]:
        return [conv3x3(in_channels, planes, stride), conv3x3(planes, planes)]


class Bottleneck(ResidualUnit):
    """1x1 reduce, 3x3, 1x1 expand by 4; the 3x3 strides ("v1.5") or the first 1x1 ("v1")."""

    expansion = 4
    n_convs = 3

    def _convs(
        self, in_channels: int, planes: int, stride: int, cfg: UnitConfig
    ) -> list[nn.Conv2d]:
        # Same weights either way, so both load torchvision's state_dicts; the 1x1 stride
        # runs the 3x3 on the smaller map (ResNet-50: 3.9G MACs against 4.1G).
        reduce_stride, spatial_stride = (stride, 1) if cfg.stride_on == "1x1" else (1, stride)
        return [
            conv1x1(in_channels, planes, reduce_stride),
            conv3x3(planes, planes, spatial_stride),
            conv1x1(planes, planes * self.expansion),
        ]
