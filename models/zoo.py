"""Names to networks: `list_models`, `build`, `describe`.

A name is `[cifar_|imagenet_]{resnet|plain|preact_resnet}{depth}`. Without a prefix, the
depths the 2015 paper used on ImageNet (resnet18..152, plain18/34) and the 2016 paper's
ImageNet pre-activation nets (preact_resnet152/200, and resnet200) are ImageNet nets;
every other depth is a CIFAR net. The prefix picks explicitly, e.g. `cifar_resnet50`.
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from models.config import (
    BLOCKS,
    SHORTCUT_OPTIONS,
    SHORTCUT_VARIANTS,
    STRIDE_ON,
    UNITS,
    Architecture,
    Block,
    Stem,
    UnitConfig,
)
from models.resnet import ResNet

# Counting a net's MACs runs it under a dispatch mode, and torch.fx's and torch.export's
# traces patch `nn.Module.__call__` for the whole process while they run: a count and a
# trace in two threads of one process (the API describing the zoo while it exports a
# net) would see each other's patches. Whoever does either holds this lock.
TRACING = threading.RLock()

FAMILIES = ("resnet", "plain", "preact_resnet")
CIFAR_WIDTHS = (16, 32, 64)
IMAGENET_WIDTHS = (64, 128, 256, 512)
# Units per stage of the ImageNet nets (2015 Table 1; ResNet-200 from the 2016 paper).
IMAGENET_LAYERS: dict[int, tuple[Block, tuple[int, ...]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
    200: ("bottleneck", (3, 24, 36, 3)),
}
# Depths that mean the ImageNet net when a name has no prefix.
IMAGENET_BY_DEFAULT: dict[str, tuple[int, ...]] = {
    "resnet": (18, 34, 50, 101, 152, 200),
    "plain": (18, 34),
    "preact_resnet": (152, 200),
}
# What `list_models()` shows: every net the two papers report on.
LISTED: tuple[str, ...] = (
    *(f"resnet{d}" for d in (20, 32, 44, 56, 110, 164, 1202)),
    *(f"plain{d}" for d in (20, 32, 44, 56, 110)),
    *(f"preact_resnet{d}" for d in (110, 164, 1001)),
    *(f"resnet{d}" for d in (18, 34, 50, 101, 152, 200)),
    "plain18",
    "plain34",
    "preact_resnet152",
    "preact_resnet200",
)
OPTIONS: dict[str, str] = {
    "block": f"one of {', '.join(BLOCKS)} (CIFAR nets only)",
    "unit": f"one of {', '.join(UNITS)}",
    "shortcut": f"one of {', '.join(SHORTCUT_OPTIONS)}",
    "shortcut_variant": f"one of {', '.join(SHORTCUT_VARIANTS)}",
    "stride_on": f"one of {', '.join(STRIDE_ON)} (nets of bottleneck units)",
    "shortcut_scale": "a number (shortcut_variant constant_scaling)",
    "residual_scale": "a number (shortcut_variant constant_scaling)",
    "gate_bias": "a number (shortcut_variant exclusive_gating or shortcut_only_gating)",
    "shortcut_dropout": "a probability in [0, 1) (shortcut_variant dropout)",
    "zero_init_residual": "true or false",
}
# Which options belong to which shortcut variant.
VARIANT_OPTIONS: dict[str, tuple[str, ...]] = {
    "shortcut_scale": ("constant_scaling",),
    "residual_scale": ("constant_scaling",),
    "gate_bias": ("exclusive_gating", "shortcut_only_gating"),
    "shortcut_dropout": ("dropout",),
}
_NAME = re.compile(r"(?:(cifar|imagenet)_)?(resnet|plain|preact_resnet)(\d+)")
# The papers' deepest nets bound a name's depth: a deeper one costs memory and hours to
# build before training starts (ResNet-100004 passed 9.8 GB while its units were made).
MAX_NAME_LENGTH = 40
MAX_DEPTH: dict[Block, int] = {"basic": 1202, "bottleneck": 1001}  # ResNet-1202, ResNet-1001
MAX_PREACT_DEPTH = 1001  # the 2016 paper's deepest pre-activation net
MAX_OPTION_NUMBER = 1e6  # scales and gate biases; an integer past float's range overflows
_DEEPEST = (
    f"the papers' deepest: {MAX_DEPTH['basic']} for 6n+2 basic nets (resnet1202), "
    f"{MAX_DEPTH['bottleneck']} for 9n+2 bottleneck and pre-activation nets (preact_resnet1001)"
)


@dataclass(frozen=True)
class Estimate:
    """What one image costs a net: parameters, forward MACs, bytes kept for backward."""

    params: int
    macs: int
    activation_bytes: int  # float32 tensors autograd saves in training mode, per image


@dataclass(frozen=True)
class ParsedName:
    """A model name split into its parts."""

    stem: Stem
    family: str
    depth: int


def list_models() -> list[str]:
    """The names of every network of both papers, in the papers' order."""
    return list(LISTED)


def build(name: str, *, num_classes: int = 10, in_channels: int = 3, **options: Any) -> ResNet:
    """Build the network `name` with He initialisation; see `OPTIONS` for the options."""
    _check_positive(num_classes=num_classes, in_channels=in_channels)
    return ResNet(resolve(name, **options), num_classes=num_classes, in_channels=in_channels)


def describe(
    name: str,
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Name, family, depth, block, wiring, parameters and MACs per image.

    MACs are counted at `input_size` (square), by default the net's own: 32 or 224.
    """
    arch = resolve(name, **options)
    _check_positive(num_classes=num_classes, in_channels=in_channels)
    default_size = 32 if arch.stem == "cifar" else 224
    size = input_size or default_size
    _check_positive(input_size=size)
    counted = _count(arch, num_classes, in_channels, size)
    parsed = parse_name(name)
    return {
        "name": name,
        "family": parsed.family,
        "stem": arch.stem,
        "depth": arch.depth,
        "block": arch.block,
        "unit": arch.unit.unit,
        "shortcut": arch.unit.shortcut if arch.unit.residual else None,
        "shortcut_variant": arch.unit.shortcut_variant if arch.unit.residual else None,
        "stride_on": arch.unit.stride_on if arch.block == "bottleneck" else None,
        "num_classes": num_classes,
        "in_channels": in_channels,
        "params": counted.params,
        "macs": counted.macs,
        "input_size": size,
        "default_input_size": default_size,
    }


def estimate(
    name: str,
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | None = None,
    **options: Any,
) -> Estimate:
    """Parameters, forward MACs and training activation bytes of `name`, per image.

    Counted without building the net: see `_count`. `input_size` defaults to the net's own.
    """
    arch = resolve(name, **options)
    _check_positive(num_classes=num_classes, in_channels=in_channels)
    size = input_size or (32 if arch.stem == "cifar" else 224)
    _check_positive(input_size=size)
    return _count(arch, num_classes, in_channels, size)


@functools.lru_cache(maxsize=256)
def _count(arch: Architecture, num_classes: int, in_channels: int, size: int) -> Estimate:
    """The costs of `arch`, from nets of one and two units per stage.

    The units of a stage after its first are identical, so every count is affine in the
    units per stage: a net's count is the one-unit-per-stage net's plus, per stage, its
    extra units times what one more unit there adds. ResNet-1202 takes 5 small meta nets
    (0.1 s) instead of one of 1202 layers (4 s).
    """
    ones = (1,) * len(arch.layers)
    base = _measure(replace(arch, layers=ones), num_classes, in_channels, size)
    totals = list(base)
    for stage, units in enumerate(arch.layers):
        if units > 1:
            layers = tuple(2 if i == stage else 1 for i in range(len(ones)))
            more = _measure(replace(arch, layers=layers), num_classes, in_channels, size)
            totals = [t + (units - 1) * (m - b) for t, m, b in zip(totals, more, base, strict=True)]
    return Estimate(*totals)


@functools.lru_cache(maxsize=256)
def _measure(
    arch: Architecture, num_classes: int, in_channels: int, size: int
) -> tuple[int, int, int]:
    """Parameters, MACs and saved activation bytes of one training forward pass, one image."""
    try:
        return _forward_costs(arch, num_classes, in_channels, size, batch=1)
    except ValueError:
        # A training-mode batch norm refuses a batch of one 1x1 map, which an ImageNet
        # net's last stage has on 32x32 images: two images, halved.
        params, macs, saved = _forward_costs(arch, num_classes, in_channels, size, batch=2)
        return params, macs // 2, saved // 2


def _forward_costs(
    arch: Architecture, num_classes: int, in_channels: int, size: int, *, batch: int
) -> tuple[int, int, int]:
    """Parameters, MACs and saved activation bytes of a training forward pass of `batch`."""
    # Built on the meta device: shapes only, no memory, no arithmetic.
    with torch.device("meta"):
        model = ResNet(arch, num_classes=num_classes, in_channels=in_channels)
        images = torch.empty(batch, in_channels, size, size)
    weights = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        # One storage can be saved by several ops (a ReLU's output, the next conv's input);
        # the weights a conv saves are parameters, not activations.
        storage = tensor.untyped_storage()
        if storage._cdata not in weights:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    model.train()
    with (
        TRACING,
        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        FlopCounterMode(display=False) as counter,
    ):
        output = model(images)  # held: the graph keeps every saved storage alive till here
    del output
    params = sum(p.numel() for p in model.parameters())
    # The flop counter counts a multiply-add as 2 FLOPs; the papers' "FLOPs" are MACs.
    return params, counter.get_total_flops() // 2, sum(saved.values())


def parse_name(name: str) -> ParsedName:
    """Split a model name into stem, family and depth, or explain what names exist."""
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"model name {name[:MAX_NAME_LENGTH]!r}... is {len(name)} characters long, over "
            f"the limit of {MAX_NAME_LENGTH}; names are like resnet110 or preact_resnet1001"
        )
    match = _NAME.fullmatch(name)
    if match is None:
        raise ValueError(
            f"model {name!r} is unknown; names are [cifar_|imagenet_]"
            f"{{{'|'.join(FAMILIES)}}}{{depth}}, e.g. {', '.join(LISTED[:4])}, resnet50"
        )
    prefix, family, digits = match.groups()
    depth = int(digits)
    deepest = max(MAX_DEPTH.values())
    if depth > deepest:
        raise ValueError(
            f"model {name!r}: depth {depth} is over the limit of {deepest} ({_DEEPEST})"
        )
    stem: Stem
    if prefix is not None:
        stem = "cifar" if prefix == "cifar" else "imagenet"
    else:
        stem = "imagenet" if depth in IMAGENET_BY_DEFAULT[family] else "cifar"
    return ParsedName(stem=stem, family=family, depth=depth)


def resolve(name: str, **options: Any) -> Architecture:
    """The architecture that `name` and its options stand for, after validating both."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        valid = "; ".join(f"{k}: {v}" for k, v in OPTIONS.items())
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for {name!r}; valid: {valid}")
    parsed = parse_name(name)
    widths: tuple[int, ...]
    if parsed.stem == "imagenet":
        block, layers = _imagenet_layers(parsed, options)
        widths = IMAGENET_WIDTHS
    else:
        block, layers = _cifar_layers(parsed, options)
        widths = CIFAR_WIDTHS
    unit = _unit_config(parsed, block, options)
    zero_init = _choice(options, "zero_init_residual", (False, True), default=False)
    return Architecture(parsed.stem, block, layers, widths, unit, zero_init_residual=zero_init)


def _imagenet_layers(parsed: ParsedName, options: dict[str, Any]) -> tuple[Block, tuple[int, ...]]:
    if parsed.depth not in IMAGENET_LAYERS:
        depths = ", ".join(map(str, IMAGENET_LAYERS))
        raise ValueError(f"depth {parsed.depth} has no ImageNet net; ImageNet depths: {depths}")
    block, layers = IMAGENET_LAYERS[parsed.depth]
    if options.get("block", block) != block:
        raise ValueError(f"ImageNet ResNet-{parsed.depth} uses {block} blocks; drop 'block'")
    return block, layers


def _cifar_layers(parsed: ParsedName, options: dict[str, Any]) -> tuple[Block, tuple[int, ...]]:
    depth = parsed.depth
    fits = {"basic": (depth - 2) % 6 == 0 and depth >= 8, "bottleneck": (depth - 2) % 9 == 0}
    fits["bottleneck"] = fits["bottleneck"] and depth >= 11
    # The 2016 paper's deep CIFAR nets (164, 1001) use bottlenecks, the shallower ones and
    # ResNet-1202 basic blocks; a depth that only one block type fits picks that one.
    only_bottleneck = fits["bottleneck"] and not fits["basic"]
    default: Block = (
        "bottleneck" if only_bottleneck or (depth >= 164 and fits["bottleneck"]) else "basic"
    )
    block: Block = _choice(options, "block", BLOCKS, default=default)
    if not fits[block]:
        raise ValueError(_depth_message(parsed, block))
    _check_depth(parsed, block)
    per_stage = (depth - 2) // (6 if block == "basic" else 9)
    return block, (per_stage,) * 3


def _check_depth(parsed: ParsedName, block: Block) -> None:
    """Refuse a CIFAR depth deeper than the papers' deepest net of its kind."""
    limit = MAX_DEPTH[block]
    if parsed.family == "preact_resnet":
        limit = min(limit, MAX_PREACT_DEPTH)
    if parsed.depth > limit:
        kind = "pre-activation" if parsed.family == "preact_resnet" else block
        raise ValueError(
            f"model '{parsed.family}{parsed.depth}': depth {parsed.depth} is over the limit "
            f"of {limit} for {kind} nets ({_DEEPEST})"
        )


def _depth_message(parsed: ParsedName, block: Block) -> str:
    basic = "6n+2 for CIFAR ResNets with basic blocks: 20, 32, 44, 56, 110, 1202, ..."
    bottleneck = "9n+2 for CIFAR ResNets with bottleneck blocks: 164, 1001, ..."
    rule = f"{basic} (or {bottleneck})" if block == "basic" else bottleneck
    return f"model '{parsed.family}{parsed.depth}': depth must be {rule}"


def _unit_config(parsed: ParsedName, block: Block, options: dict[str, Any]) -> UnitConfig:
    residual = parsed.family != "plain"
    shortcut_options = {"shortcut", "shortcut_variant", *VARIANT_OPTIONS}
    if not residual and shortcut_options & set(options):
        given = ", ".join(sorted(shortcut_options & set(options)))
        raise ValueError(f"plain nets have no shortcuts; drop {given} or use a resnet")
    default_unit = "full_preact" if parsed.family == "preact_resnet" else "original"
    # Option A on the 2015 CIFAR nets; projections where dimensions grow elsewhere.
    default_shortcut = "A" if parsed.stem == "cifar" and block == "basic" else "B"
    variant = _choice(options, "shortcut_variant", SHORTCUT_VARIANTS, default="identity")
    for option, variants in VARIANT_OPTIONS.items():
        if option in options and variant not in variants:
            raise ValueError(
                f"{option} applies to shortcut_variant {' or '.join(variants)}, not {variant}"
            )
    if variant == "conv1x1" and "shortcut" in options:
        raise ValueError("shortcut_variant conv1x1 makes every shortcut a 1x1 conv; drop shortcut")
    dropout = _number(options, "shortcut_dropout", 0.5)
    if not 0 <= dropout < 1:
        raise ValueError(f"shortcut_dropout must be in [0, 1), got {dropout}")
    if block != "bottleneck" and "stride_on" in options:
        raise ValueError(
            f"model '{parsed.family}{parsed.depth}' has basic units; stride_on applies to nets "
            "of bottleneck units: resnet50/101/152/200, preact_resnet152/200, resnet164, "
            "preact_resnet1001, or a CIFAR net with block bottleneck; drop stride_on"
        )
    return UnitConfig(
        unit=_choice(options, "unit", UNITS, default=default_unit),
        residual=residual,
        shortcut=_choice(options, "shortcut", SHORTCUT_OPTIONS, default=default_shortcut),
        shortcut_variant=variant,
        shortcut_scale=_number(options, "shortcut_scale", 0.5),
        residual_scale=_number(options, "residual_scale", 0.5),
        gate_bias=_number(options, "gate_bias", -6.0),
        shortcut_dropout=dropout,
        stride_on=_choice(options, "stride_on", STRIDE_ON, default="3x3"),
    )


def _choice(options: dict[str, Any], key: str, valid: tuple[Any, ...], *, default: Any) -> Any:
    value = options.get(key, default)
    # `True in (1,)` holds in Python, so compare types too.
    if not any(value == v and type(value) is type(v) for v in valid):
        raise ValueError(f"{key} must be one of {', '.join(map(str, valid))}; got {value!r}")
    return value


def _number(options: dict[str, Any], key: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number; got {value!r}")
    if not -MAX_OPTION_NUMBER <= value <= MAX_OPTION_NUMBER:
        shown = f"{value:.6g}" if isinstance(value, float) else f"{len(str(value))} digits"
        raise ValueError(f"{key} must be within +-{MAX_OPTION_NUMBER:g}; got {shown}")
    return float(value)


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer; got {value!r}")
