"""Names, options, parameter counts and MACs against the papers (shared/PAPERS.md)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torchvision

import models
from models.zoo import _measure

# 2015 Table 6: exact parameter counts at 10 classes, options A and B.
CIFAR_PARAMS = {
    20: (269_722, 272_474),
    32: (464_154, 466_906),
    44: (658_586, 661_338),
    56: (853_018, 855_770),
    110: (1_727_962, 1_730_714),
    1202: (19_421_274, 19_424_026),
}
# Forward multiply-adds per 32x32 image (2015 paper and PAPERS.md).
CIFAR_MACS = {"resnet20": 40.6e6, "resnet56": 125.5e6, "resnet110": 252.9e6}
# 2015 Table 1's FLOPs column, which counts multiply-adds.
IMAGENET_MACS = {
    "resnet18": 1.8e9,
    "resnet34": 3.6e9,
    "resnet50": 3.8e9,
    "resnet101": 7.6e9,
    "resnet152": 11.3e9,
}
# The bottleneck nets as the 2015 paper built them: the stride on the first 1x1 conv.
BOTTLENECK_V1_MACS = {name: IMAGENET_MACS[name] for name in ("resnet50", "resnet101", "resnet152")}


@pytest.mark.parametrize(("depth", "counts"), CIFAR_PARAMS.items())
def test_cifar_resnet_params_equal_paper(depth: int, counts: tuple[int, int]) -> None:
    option_a, option_b = counts
    assert models.describe(f"resnet{depth}")["params"] == option_a
    assert models.describe(f"resnet{depth}", shortcut="B")["params"] == option_b
    assert option_a == 97_216 * ((depth - 2) // 6) - 21_926


@pytest.mark.parametrize("depth", [20, 32, 44, 56, 110])
def test_plain_nets_have_the_params_of_their_resnet(depth: int) -> None:
    assert models.describe(f"plain{depth}")["params"] == CIFAR_PARAMS[depth][0]


def test_option_c_projects_every_shortcut() -> None:
    # 9 units, each a 1x1 conv + BN on its shortcut; 2 of them are option B's.
    option_b = models.describe("resnet20", shortcut="B")["params"]
    option_c = models.describe("resnet20", shortcut="C")["params"]
    extra = 3 * (16 * 16 + 32) + 2 * (32 * 32 + 64) + 2 * (64 * 64 + 128)
    assert option_c == option_b + extra


@pytest.mark.parametrize(
    ("name", "params"), [("preact_resnet164", 1_703_258), ("preact_resnet1001", 10_327_706)]
)
def test_preact_bottleneck_params_equal_paper(name: str, params: int) -> None:
    info = models.describe(name)
    assert (info["params"], info["block"], info["unit"]) == (params, "bottleneck", "full_preact")


@pytest.mark.parametrize("depth", [18, 34, 50, 101, 152])
def test_imagenet_params_equal_torchvision(depth: int) -> None:
    reference = getattr(torchvision.models, f"resnet{depth}")()
    expected = sum(p.numel() for p in reference.parameters())
    assert models.describe(f"resnet{depth}", num_classes=1000)["params"] == expected


@pytest.mark.parametrize(("name", "macs"), CIFAR_MACS.items())
def test_cifar_macs_within_one_percent(name: str, macs: float) -> None:
    assert models.describe(name)["macs"] == pytest.approx(macs, rel=0.01)


@pytest.mark.parametrize(("name", "macs"), IMAGENET_MACS.items())
def test_imagenet_macs_within_ten_percent_of_paper(name: str, macs: float) -> None:
    info = models.describe(name, num_classes=1000)
    assert info["default_input_size"] == 224
    assert info["macs"] == pytest.approx(macs, rel=0.10)


@pytest.mark.parametrize(("name", "macs"), BOTTLENECK_V1_MACS.items())
def test_stride_on_the_1x1_conv_gives_table_1s_macs_with_the_same_params(
    name: str, macs: float
) -> None:
    v1 = models.describe(name, num_classes=1000, stride_on="1x1")
    v15 = models.describe(name, num_classes=1000)
    # Table 1 rounds to a tenth of a billion: 3.86G for ResNet-50 is its "3.8".
    assert v1["macs"] == pytest.approx(macs, rel=0.03)
    assert v1["macs"] < v15["macs"]
    assert v1["params"] == v15["params"]
    assert (v1["stride_on"], v15["stride_on"]) == ("1x1", "3x3")


def _strides(net: models.ResNet, unit: str) -> tuple[tuple[int, ...], ...]:
    """The strides of a unit's three convs, e.g. unit "layer2.0"."""
    modules = dict(net.named_modules())
    convs = [modules[f"{unit}.conv{i}"] for i in (1, 2, 3)]
    return tuple(tuple(c.stride) for c in convs if isinstance(c, torch.nn.Conv2d))


def test_stride_on_moves_the_stride_of_downsampling_bottlenecks_only() -> None:
    with torch.device("meta"):
        v1 = models.build("resnet50", stride_on="1x1")
        v15 = models.build("resnet50")
    assert _strides(v1, "layer2.0") == ((2, 2), (1, 1), (1, 1))
    assert _strides(v15, "layer2.0") == ((1, 1), (2, 2), (1, 1))
    assert _strides(v1, "layer2.1") == _strides(v15, "layer2.1") == ((1, 1),) * 3
    assert models.describe("resnet18")["stride_on"] is None


def test_list_models_holds_every_paper_net() -> None:
    names = models.list_models()
    required = [f"resnet{d}" for d in (20, 32, 44, 56, 110, 1202)]
    required += [f"plain{d}" for d in (20, 32, 44, 56, 110)]
    required += ["preact_resnet164", "preact_resnet1001", "preact_resnet152", "preact_resnet200"]
    required += [f"resnet{d}" for d in (18, 34, 50, 101, 152)] + ["plain18", "plain34"]
    assert set(required) <= set(names)
    assert len(names) == len(set(names))


def test_describe_reports_the_wiring() -> None:
    info = models.describe("resnet110", unit="bn_after_add", shortcut_variant="exclusive_gating")
    assert {k: info[k] for k in ("family", "stem", "depth", "block", "unit")} == {
        "family": "resnet",
        "stem": "cifar",
        "depth": 110,
        "block": "basic",
        "unit": "bn_after_add",
    }
    assert info["shortcut_variant"] == "exclusive_gating"
    assert models.describe("plain20")["shortcut"] is None


@pytest.mark.parametrize(
    ("name", "stem", "block", "depth"),
    [
        ("resnet50", "imagenet", "bottleneck", 50),
        ("cifar_resnet50", "cifar", "basic", 50),
        ("resnet152", "imagenet", "bottleneck", 152),
        ("cifar_resnet152", "cifar", "basic", 152),
        ("resnet164", "cifar", "bottleneck", 164),
        ("resnet1001", "cifar", "bottleneck", 1001),
        ("preact_resnet110", "cifar", "basic", 110),
        ("preact_resnet200", "imagenet", "bottleneck", 200),
        ("imagenet_preact_resnet50", "imagenet", "bottleneck", 50),
        ("resnet8", "cifar", "basic", 8),
    ],
)
def test_names_resolve_to_the_papers_nets(name: str, stem: str, block: str, depth: int) -> None:
    arch = models.resolve(name)
    assert (arch.stem, arch.block, arch.depth) == (stem, block, depth)


def test_block_option_overrides_the_papers_choice() -> None:
    assert models.resolve("preact_resnet164", block="basic").layers == (27, 27, 27)
    assert models.resolve("resnet110", block="bottleneck").layers == (12, 12, 12)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("resnet21", {}, "depth must be 6n+2 for CIFAR ResNets with basic blocks: 20, 32"),
        ("resnet32", {"block": "bottleneck"}, "depth must be 9n+2"),
        ("vgg16", {}, "model 'vgg16' is unknown"),
        ("imagenet_resnet20", {}, "ImageNet depths: 18, 34, 50, 101, 152, 200"),
        ("resnet50", {"block": "basic"}, "uses bottleneck blocks"),
        ("resnet20", {"shorcut": "B"}, "unknown option(s) shorcut"),
        ("resnet20", {"shortcut": "D"}, "shortcut must be one of A, B, C; got 'D'"),
        ("resnet20", {"unit": "preact"}, "unit must be one of original, bn_after_add"),
        ("resnet20", {"shortcut_variant": "gate"}, "shortcut_variant must be one of identity"),
        ("resnet20", {"gate_bias": -6}, "gate_bias applies to shortcut_variant exclusive_gating"),
        ("resnet20", {"shortcut_variant": "dropout", "shortcut_dropout": 1.0}, "[0, 1)"),
        ("resnet20", {"shortcut_variant": "constant_scaling", "shortcut_scale": "x"}, "number"),
        ("resnet20", {"zero_init_residual": 1}, "zero_init_residual must be one of False, True"),
        ("plain20", {"shortcut": "B"}, "plain nets have no shortcuts"),
        ("resnet20", {"shortcut_variant": "conv1x1", "shortcut": "A"}, "drop shortcut"),
        ("resnet50", {"stride_on": "2x2"}, "stride_on must be one of 1x1, 3x3; got '2x2'"),
        ("resnet18", {"stride_on": "1x1"}, "'resnet18' has basic units; stride_on applies to"),
        ("resnet110", {"stride_on": "3x3"}, "resnet50/101/152/200, preact_resnet152/200"),
    ],
)
def test_bad_names_and_options_say_what_is_valid(
    name: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        models.build(name, **options)


@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_num_classes_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(ValueError, match="num_classes must be a positive integer"):
        models.build("resnet20", num_classes=value)  # type: ignore[arg-type]


def test_macs_scale_with_the_input_size() -> None:
    at_32 = models.describe("resnet20")
    at_8 = models.describe("resnet20", input_size=8, in_channels=1)
    assert (at_8["input_size"], at_8["default_input_size"]) == (8, 32)
    # Every conv runs on 1/16 of the positions; only the first conv's input channels change.
    assert at_8["macs"] == pytest.approx(at_32["macs"] / 16, rel=0.01)


@pytest.mark.parametrize(
    ("name", "limit"),
    [
        ("resnet100004", 1202),
        ("resnet1208", 1202),
        ("plain1208", 1202),
        ("preact_resnet1010", 1001),
        ("preact_resnet1202", 1001),
        ("resnet1010", 1001),  # 9n+2 from 164 on: bottleneck units
        (f"resnet{2**31 + 4}", 1202),
    ],
)
def test_depth_beyond_the_papers_deepest_is_refused_by_name(name: str, limit: int) -> None:
    # Refused from the name alone: the tests would run out of memory if the net were built.
    with pytest.raises(ValueError, match=f"is over the limit of {limit} "):
        models.describe(name)
    with pytest.raises(ValueError, match=f"is over the limit of {limit} "):
        models.build(name)


@pytest.mark.parametrize("name", ["resnet1202", "plain1202", "preact_resnet1001", "resnet1001"])
def test_the_papers_deepest_nets_stay_within_the_limits(name: str) -> None:
    digits = re.search(r"\d+$", name)
    assert digits is not None
    assert models.resolve(name).depth == int(digits.group())


def test_a_long_name_is_refused_with_the_length_limit() -> None:
    with pytest.raises(ValueError, match=f"is 46 characters long, over the limit of {40}"):
        models.resolve("resnet" + "0" * 38 + "20")


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("resnet56", {"shortcut": "C"}),
        ("preact_resnet164", {}),
        ("resnet110", {"shortcut_variant": "exclusive_gating"}),
        ("resnet50", {}),
        ("resnet101", {"stride_on": "1x1"}),
        ("resnet164", {"stride_on": "1x1"}),
    ],
)
def test_estimates_equal_the_whole_net_counted(name: str, options: dict[str, Any]) -> None:
    # `estimate` extrapolates from nets of one and two units per stage; it must equal
    # the count of the whole net, which `_measure` builds on the meta device.
    arch = models.resolve(name, **options)
    whole = _measure(arch, 10, 3, 32 if arch.stem == "cifar" else 224)
    found = models.estimate(name, **options)
    assert (found.params, found.macs, found.activation_bytes) == whole
    assert found.params == models.describe(name, **options)["params"]


def test_activation_bytes_count_what_backward_keeps() -> None:
    # ResNet-20 at 32x32: each conv's output is kept for its BN, and each ReLU's output for
    # the next conv (the same tensor its own backward keeps): twice the conv outputs.
    conv_outputs = 16 * 32 * 32 * 7 + 32 * 16 * 16 * 6 + 64 * 8 * 8 * 6
    r20 = models.estimate("resnet20")
    assert 2 * 4 * conv_outputs <= r20.activation_bytes <= 2.1 * 4 * conv_outputs
    assert models.estimate("resnet110").activation_bytes > 5 * r20.activation_bytes
    small = models.estimate("resnet20", input_size=16)
    assert small.activation_bytes == pytest.approx(r20.activation_bytes / 4, rel=0.05)


def test_an_imagenet_net_on_cifar_sized_images_is_counted() -> None:
    # Its last stage's maps are 1x1 there, which a batch norm refuses for a single image.
    small = models.estimate("resnet18", input_size=32)
    full = models.estimate("resnet18")
    assert small.params == full.params
    assert small.macs == pytest.approx(full.macs * (32 / 224) ** 2, rel=0.1)
