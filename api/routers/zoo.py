"""The model zoo: every network of both papers with its parameters and MACs, and the
options that `models.build` takes, for forms that build a net."""

from __future__ import annotations

import threading
from functools import cache
from typing import Annotated

from fastapi import APIRouter, Path

import models
from api.deps import ReadKey
from api.errors import responses
from api.schemas import ModelOptionOut, ModelOptionsOut, ModelOut, OptionChoice
from core.errors import InvalidError
from models.config import (
    BLOCKS,
    SHORTCUT_OPTIONS,
    SHORTCUT_VARIANTS,
    STRIDE_ON,
    UNITS,
    UnitConfig,
)
from models.zoo import FAMILIES, VARIANT_OPTIONS

router = APIRouter(prefix="/models", tags=["models"])
# Counting MACs takes about 12 s of CPU for the whole zoo (ResNet-1202 alone 2.5 s), so the
# app describes the nets in the background at start; a lock per net keeps a request
# that arrives meanwhile from counting the same net twice.
_locks: dict[str, threading.Lock] = {}


@cache
def _described(name: str) -> ModelOut:
    return ModelOut.model_validate(models.describe(name))


def describe(name: str) -> ModelOut:
    """One net of the zoo, described once per process."""
    with _locks.setdefault(name, threading.Lock()):
        return _described(name)


def warm_up(stop: threading.Event) -> None:
    """Describe every net ahead of the first request, until `stop` is set."""
    for name in models.list_models():
        if stop.is_set():
            return
        describe(name)


@router.get("", summary="The model zoo", responses=responses(401, 403))
def list_zoo(_: ReadKey) -> list[ModelOut]:
    """Every net of both papers, in the papers' order, with params and MACs per image."""
    return [describe(name) for name in models.list_models()]


# Plain nets have no shortcuts, so only the other families take the shortcut options.
RESIDUAL_FAMILIES = tuple(family for family in FAMILIES if family != "plain")
# What each option does; its values and defaults come from `models` itself.
DESCRIPTIONS: dict[str, str] = {
    "block": "The units' block, CIFAR nets only (an ImageNet depth fixes it); by default the "
    "one the depth fits, bottleneck from depth 164 on",
    "unit": "Where BN and ReLU sit around the addition (2016 Table 2); by default original, "
    "full_preact for preact_resnet",
    "shortcut": "How a shortcut meets a change of dimensions (2015 Sec. 4.1); by default A for "
    "CIFAR nets of basic blocks, else B",
    "shortcut_variant": "What the shortcut does to its input (2016 Table 1)",
    "stride_on": "Which conv of a downsampling bottleneck strides, nets of bottleneck units "
    "only: the 3x3 as torchvision, or the first 1x1 as the 2015 paper",
    "shortcut_scale": "The shortcut's scale (constant scaling)",
    "residual_scale": "The residual branch's scale (constant scaling)",
    "gate_bias": "The gate's bias at init (gating); a negative one favours the shortcut",
    "shortcut_dropout": "The probability of dropping the shortcut, in [0, 1)",
    "zero_init_residual": "Zero the last BN (or conv) of every residual branch at init",
}
# What a form shows for each value of a choice; a value missing here shows as itself.
LABELS: dict[str, str] = {
    "basic": "basic: two 3x3 convs",
    "bottleneck": "bottleneck: 1x1, 3x3, 1x1 convs",
    "original": "original (2016 Fig. 4a)",
    "bn_after_add": "BN after addition (Fig. 4b)",
    "relu_before_add": "ReLU before addition (Fig. 4c)",
    "relu_only_preact": "ReLU-only pre-activation (Fig. 4d)",
    "full_preact": "full pre-activation (Fig. 4e)",
    "A": "A: zero-padding, parameter-free",
    "B": "B: projections where dimensions grow",
    "C": "C: projections everywhere",
    "identity": "identity (2016 Fig. 2a)",
    "constant_scaling": "constant scaling (Fig. 2b)",
    "exclusive_gating": "exclusive gating (Fig. 2c)",
    "shortcut_only_gating": "shortcut-only gating (Fig. 2d)",
    "conv1x1": "1x1 conv shortcut (Fig. 2e)",
    "dropout": "dropout shortcut (Fig. 2f)",
    "1x1": "1x1: the first 1x1 conv, as the 2015 paper (v1)",
    "3x3": "3x3: the 3x3 conv, as torchvision (v1.5)",
}


@router.get("/options", summary="The options of the zoo's nets", responses=responses(401, 403))
def list_options(_: ReadKey) -> ModelOptionsOut:
    """The families and each option of `models.build`: values, default, nets it applies to."""
    return ModelOptionsOut(families=list(FAMILIES), options=options())


def options() -> list[ModelOptionOut]:
    """The options of `models.build`, in the order a form shows them."""
    unit = UnitConfig()
    # A conv1x1 shortcut variant makes every shortcut a projection: no option A, B or C.
    projectable = tuple(variant for variant in SHORTCUT_VARIANTS if variant != "conv1x1")
    choices = [
        _choice("block", BLOCKS),
        _choice("unit", UNITS),
        _choice("shortcut", SHORTCUT_OPTIONS, families=RESIDUAL_FAMILIES, variants=projectable),
        _choice(
            "shortcut_variant",
            SHORTCUT_VARIANTS,
            default=unit.shortcut_variant,
            families=RESIDUAL_FAMILIES,
        ),
        _choice("stride_on", STRIDE_ON, default=unit.stride_on),
    ]
    numbers = [_number(name, getattr(unit, name)) for name in VARIANT_OPTIONS]
    zero_init = ModelOptionOut(
        name="zero_init_residual",
        kind="boolean",
        description=DESCRIPTIONS["zero_init_residual"],
        default=False,
        families=list(FAMILIES),
    )
    return [*choices, *numbers, zero_init]


def _choice(
    name: str,
    values: tuple[str, ...],
    *,
    default: str | None = None,
    families: tuple[str, ...] = FAMILIES,
    variants: tuple[str, ...] | None = None,
) -> ModelOptionOut:
    return ModelOptionOut(
        name=name,
        kind="choice",
        description=DESCRIPTIONS[name],
        default=default,
        choices=[OptionChoice(value=value, label=LABELS.get(value, value)) for value in values],
        families=list(families),
        shortcut_variants=None if variants is None else list(variants),
    )


def _number(name: str, default: float) -> ModelOptionOut:
    return ModelOptionOut(
        name=name,
        kind="number",
        description=DESCRIPTIONS[name],
        default=default,
        families=list(RESIDUAL_FAMILIES),
        shortcut_variants=list(VARIANT_OPTIONS[name]),
    )


# After /options, which this path would otherwise take.
@router.get(
    "/{name}",
    summary="Describe any net of the zoo by name",
    responses=responses(401, 403, 422),
)
def describe_model(
    name: Annotated[str, Path(max_length=models.MAX_NAME_LENGTH, examples=["resnet110"])],
    _: ReadKey,
) -> ModelOut:
    """Any valid name, listed or not (`resnet1202`, `cifar_resnet50`): its wiring, params
    and MACs per image; a name the zoo cannot build is a 422 saying what names exist."""
    try:
        models.resolve(name)  # the name's limits first: nothing is counted or kept before
    except ValueError as error:
        raise InvalidError(str(error), field=("path", "name")) from None
    return describe(name)
