"""The settings that describe one network: a table row, validated once, then built.

`Architecture` is what `models.build` resolves a name and its options to; the builders in
`resnet.py` read nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

Stem = Literal["cifar", "imagenet"]
Block = Literal["basic", "bottleneck"]
Unit = Literal["original", "bn_after_add", "relu_before_add", "relu_only_preact", "full_preact"]
ShortcutOption = Literal["A", "B", "C"]
StrideOn = Literal["1x1", "3x3"]
ShortcutVariant = Literal[
    "identity",
    "constant_scaling",
    "exclusive_gating",
    "shortcut_only_gating",
    "conv1x1",
    "dropout",
]

BLOCKS: tuple[Block, ...] = get_args(Block)
UNITS: tuple[Unit, ...] = get_args(Unit)
SHORTCUT_OPTIONS: tuple[ShortcutOption, ...] = get_args(ShortcutOption)
STRIDE_ON: tuple[StrideOn, ...] = get_args(StrideOn)
SHORTCUT_VARIANTS: tuple[ShortcutVariant, ...] = get_args(ShortcutVariant)

# Units whose activation precedes the convolutions (2016 Fig. 4d, 4e).
PREACT_UNITS: frozenset[Unit] = frozenset({"relu_only_preact", "full_preact"})


@dataclass(frozen=True)
class UnitConfig:
    """How every residual unit of a net is wired (2015 options, 2016 ablations).

    Defaults are the papers' best settings: the original unit with identity shortcuts, and
    for each shortcut variant the setting that trained best in 2016 Table 1 (scales
    0.5 / 0.5, gate bias -6); dropout 0.5 is the paper's only dropout setting.
    """

    unit: Unit = "original"
    residual: bool = True  # False: a plain net, the same layers without shortcuts
    shortcut: ShortcutOption = "A"
    shortcut_variant: ShortcutVariant = "identity"
    shortcut_scale: float = 0.5
    residual_scale: float = 0.5
    gate_bias: float = -6.0
    shortcut_dropout: float = 0.5
    # Which conv of a downsampling bottleneck strides: torchvision's 3x3 ("v1.5"), or the
    # first 1x1 as in the 2015 paper and the authors' Caffe and Torch models ("v1").
    stride_on: StrideOn = "3x3"

    @property
    def preact(self) -> bool:
        """Whether the unit's activation comes before its convolutions."""
        return self.unit in PREACT_UNITS


@dataclass(frozen=True)
class Architecture:
    """One network: stem, block type, units per stage, stage widths and unit wiring."""

    stem: Stem
    block: Block
    layers: tuple[int, ...]
    widths: tuple[int, ...]
    unit: UnitConfig = field(default_factory=UnitConfig)
    zero_init_residual: bool = False

    @property
    def expansion(self) -> int:
        """Output channels of a unit per channel of its stage width."""
        return 4 if self.block == "bottleneck" else 1

    @property
    def depth(self) -> int:
        """Weighted layers: the stem conv, every conv in the units, and the classifier."""
        convs_per_unit = 3 if self.block == "bottleneck" else 2
        return 2 + convs_per_unit * sum(self.layers)
