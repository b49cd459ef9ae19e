"""Every registered net and every ablation option: forward, backward, shape, finiteness."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

import models
from models.config import SHORTCUT_VARIANTS, UNITS


def _check_trains(model: torch.nn.Module, x: torch.Tensor, num_classes: int) -> None:
    """One forward and backward pass: right shape, finite output, a gradient everywhere."""
    out = model(x)
    assert out.shape == (x.shape[0], num_classes)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"


@pytest.mark.parametrize("name", models.list_models())
def test_every_registered_model_trains(name: str) -> None:
    torch.manual_seed(0)
    model = models.build(name, num_classes=7)
    # CIFAR nets take inputs from 8x8; ImageNet nets need 32x32 to keep a 1x1 map at the end.
    size = 8 if models.resolve(name).stem == "cifar" else 32
    _check_trains(model, torch.randn(2, 3, size, size), num_classes=7)


@pytest.mark.parametrize(
    ("unit", "variant", "block"),
    [(u, v, "basic") for u, v in itertools.product(UNITS, SHORTCUT_VARIANTS)]
    + [(u, "identity", "bottleneck") for u in UNITS],
)
def test_every_ablation_trains(unit: str, variant: str, block: str) -> None:
    torch.manual_seed(0)
    name = "resnet20" if block == "basic" else "resnet29"
    model = models.build(name, unit=unit, shortcut_variant=variant, block=block)
    _check_trains(model, torch.randn(2, 3, 16, 16), num_classes=10)


@pytest.mark.parametrize("shortcut", ["A", "B", "C"])
@pytest.mark.parametrize("name", ["resnet8", "preact_resnet11", "cifar_plain8"])
def test_shortcut_options_and_families_train(name: str, shortcut: str) -> None:
    options: dict[str, Any] = {} if "plain" in name else {"shortcut": shortcut}
    model = models.build(name, **options)
    _check_trains(model, torch.randn(2, 3, 8, 8), num_classes=10)


@pytest.mark.parametrize(("in_channels", "num_classes"), [(1, 10), (3, 100), (1, 1)])
@pytest.mark.parametrize("name", ["resnet20", "preact_resnet164", "resnet18"])
def test_any_channels_and_classes(name: str, in_channels: int, num_classes: int) -> None:
    model = models.build(name, num_classes=num_classes, in_channels=in_channels).eval()
    with torch.no_grad():
        out = model(torch.randn(1, in_channels, 28, 28))
    assert out.shape == (1, num_classes)


def test_reset_classifier_changes_the_outputs() -> None:
    model = models.build("resnet20")
    assert isinstance(model, models.ResNet)
    model.reset_classifier(3)
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 3)
