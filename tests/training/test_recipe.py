"""The papers' recipe: budget, learning-rate schedule and warm-up."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from training.data import DatasetInfo
from training.recipe import (
    augment_pad,
    describe_augmentation,
    learning_rate,
    make_optimizer,
    resolve_defaults,
    total_iterations,
    uses_paper_warmup,
    warmup_over,
)
from training.specs import ModelSpec, RecipeSpec, TrainSpec

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
DATASETS: dict[str, dict[str, Any]] = {
    "cifar10": {"name": "cifar10"},
    "cifar100": {"name": "cifar100"},
    "imagefolder": {"name": "imagefolder", "path": "flowers"},
    "fashion_mnist": {"name": "fashion_mnist"},
    "mnist": {"name": "mnist"},
    "digits": {"name": "digits"},
    "synthetic": {"name": "synthetic"},
}
SIZES = {"cifar10": 32, "cifar100": 32, "imagefolder": 224, "fashion_mnist": 28, "mnist": 28}


def _train_spec(dataset: str, **recipe: Any) -> TrainSpec:
    return TrainSpec.model_validate(
        {"model": {"name": "resnet20"}, "dataset": DATASETS[dataset], "recipe": recipe}
    )


def _info(dataset: str, channels: int = 3) -> DatasetInfo:
    size = SIZES.get(dataset, 8 if dataset == "digits" else 32)
    mean, std = (0.5,) * channels, (0.25,) * channels
    return DatasetInfo(dataset, ("a", "b"), channels, (size, size), mean, std)


def test_default_recipe_is_the_papers() -> None:
    recipe = RecipeSpec()
    assert (recipe.lr, recipe.momentum, recipe.weight_decay, recipe.batch_size) == (
        0.1,
        0.9,
        1e-4,
        128,
    )
    assert total_iterations(recipe, batches_per_epoch=351) == 64_000
    # lr / 10 at 32k and 48k of 64k iterations.
    lrs = {
        s: learning_rate(recipe, s, 64_000, warming_up=False)
        for s in (0, 31_999, 32_000, 47_999, 48_000, 63_999)
    }
    assert lrs == pytest.approx(
        {0: 0.1, 31_999: 0.1, 32_000: 0.01, 47_999: 0.01, 48_000: 0.001, 63_999: 0.001}
    )


def test_epoch_budget_counts_batches() -> None:
    assert total_iterations(RecipeSpec(epochs=2.5), batches_per_epoch=10) == 25


def test_cosine_and_onecycle_schedules() -> None:
    cosine = RecipeSpec(schedule="cosine")
    assert learning_rate(cosine, 0, 100, warming_up=False) == pytest.approx(0.1)
    assert learning_rate(cosine, 50, 100, warming_up=False) == pytest.approx(0.05)
    onecycle = RecipeSpec(schedule="onecycle")
    peak = learning_rate(onecycle, 30, 100, warming_up=False)
    assert learning_rate(onecycle, 0, 100, warming_up=False) < peak == pytest.approx(0.1)
    assert learning_rate(onecycle, 99, 100, warming_up=False) < 0.001


def test_linear_warmup_ramps_to_the_base_lr() -> None:
    recipe = RecipeSpec(warmup="linear", warmup_iterations=10)
    assert learning_rate(recipe, 0, 1000, warming_up=False) == pytest.approx(0.01)
    assert learning_rate(recipe, 9, 1000, warming_up=False) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("name", "options", "expected"),
    [
        ("resnet20", {}, False),
        ("resnet56", {}, False),
        ("resnet110", {}, True),
        ("resnet20", {"unit": "full_preact"}, True),
        ("resnet20", {"shortcut_variant": "exclusive_gating"}, True),
        ("preact_resnet164", {}, True),
    ],
)
def test_paper_warmup_for_deep_and_2016_nets(
    name: str, options: dict[str, str], expected: bool
) -> None:
    assert uses_paper_warmup(RecipeSpec(), ModelSpec(name=name, options=options)) is expected
    assert not uses_paper_warmup(RecipeSpec(warmup="off"), ModelSpec(name="resnet110"))


def test_paper_warmup_holds_lr_until_error_below_80_percent() -> None:
    recipe = RecipeSpec()
    assert learning_rate(recipe, 5, 64_000, warming_up=True) == 0.01
    assert not warmup_over(recipe, 100, train_error=0.85)
    assert warmup_over(recipe, 100, train_error=0.79)
    assert warmup_over(recipe, 400, train_error=0.9)


@pytest.mark.parametrize("optimizer", ["sgd", "nesterov", "adamw"])
def test_optimizers(optimizer: str) -> None:
    model = torch.nn.Linear(3, 2)
    built = make_optimizer(RecipeSpec.model_validate({"optimizer": optimizer}), model)
    group = built.param_groups[0]
    assert group["lr"] == 0.1
    assert group["weight_decay"] == 1e-4
    if optimizer != "adamw":
        assert group["nesterov"] is (optimizer == "nesterov")


@pytest.mark.parametrize(
    ("dataset", "pad", "flip"),
    [
        ("cifar10", 4, True),
        ("cifar100", 4, True),
        ("imagefolder", 28, True),
        ("fashion_mnist", 4, True),
        ("mnist", 4, False),
        ("digits", 1, False),
        ("synthetic", 4, False),
    ],
)
def test_augmentation_defaults_fit_the_dataset(dataset: str, pad: int, flip: bool) -> None:
    used = resolve_defaults(_train_spec(dataset), _info(dataset), CPU).recipe
    assert (used.augment_pad, used.augment_flip) == (pad, flip)


@pytest.mark.parametrize(
    ("size", "pad"),
    [(32, 4), (28, 4), (20, 3), (12, 2), (8, 1), (4, 1), (64, 8), (224, 28), (1024, 32)],
)
def test_auto_pad_is_an_eighth_of_the_size_rounded_half_up(size: int, pad: int) -> None:
    assert augment_pad(RecipeSpec(), (size, size)) == pad
    assert augment_pad(RecipeSpec(), (size, 2 * size)) == pad  # the shorter side counts


@pytest.mark.parametrize("dataset", ["cifar10", "digits"])
def test_explicit_augmentation_wins(dataset: str) -> None:
    for pad, flip in [(0, True), (7, False)]:
        spec = _train_spec(dataset, augment_pad=pad, augment_flip=flip)
        used = resolve_defaults(spec, _info(dataset), CPU).recipe
        assert (used.augment_pad, used.augment_flip) == (pad, flip)


def test_resolving_changes_only_the_defaults() -> None:
    spec = _train_spec("digits", lr=0.05, augment_pad=2)
    used = resolve_defaults(spec, _info("digits"), CPU)
    assert used.model_dump(exclude={"recipe"}) == spec.model_dump(exclude={"recipe"})
    changed = {
        name
        for name, value in used.recipe.model_dump().items()
        if value != getattr(spec.recipe, name)
    }
    assert changed == {"augment_flip", "augmentation", "channels_last"}
    # Resolved once, a spec resolves to itself (a written spec.json trains the same run).
    assert resolve_defaults(used, _info("digits"), CPU) == used


def test_a_resumed_run_keeps_its_recorded_augmentation() -> None:
    recorded = RecipeSpec(augment_pad=4, augment_flip=True)  # written before the auto defaults
    spec = _train_spec("digits")
    used = resolve_defaults(spec, _info("digits"), CPU, resumed=recorded).recipe
    assert (used.augment_pad, used.augment_flip) == (4, True)
    explicit = _train_spec("digits", augment_flip=False)
    used = resolve_defaults(explicit, _info("digits"), CPU, resumed=recorded).recipe
    assert (used.augment_pad, used.augment_flip) == (4, False)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, "augmentation: cifar, pad 1, no flip (digits: a flip changes the label)"),
        (
            {"augment_pad": 2, "augment_flip": True},
            "augmentation: cifar, pad 2 (as given), flip (as given)",
        ),
        ({"augment": False}, "augmentation: off"),
    ],
)
def test_the_augmentation_line_says_why(given: dict[str, Any], expected: str) -> None:
    spec = _train_spec("digits", **given)
    used = resolve_defaults(spec, _info("digits"), CPU)
    assert describe_augmentation(spec.recipe, used) == expected
    cifar = _train_spec("cifar10")
    line = describe_augmentation(cifar.recipe, resolve_defaults(cifar, _info("cifar10"), CPU))
    assert line == "augmentation: cifar, pad 4, flip (cifar10: a flip keeps the label)"


@pytest.mark.parametrize(("device", "expected"), [(CPU, True), (CUDA, True)])
def test_channels_last_is_the_default_where_it_is_faster(
    device: torch.device, expected: bool
) -> None:
    spec = _train_spec("fashion_mnist")
    assert (
        resolve_defaults(spec, _info("fashion_mnist", 1), device).recipe.channels_last is expected
    )
    given = _train_spec("fashion_mnist", channels_last=False)
    assert resolve_defaults(given, _info("fashion_mnist", 1), device).recipe.channels_last is False


def test_the_augmentation_recipe_follows_the_datasets_kind() -> None:
    cifar = resolve_defaults(_train_spec("digits"), _info("digits"), CPU)
    assert cifar.recipe.augmentation == "cifar"
    photos = TrainSpec.model_validate(
        {
            "model": {"name": "resnet18"},
            "dataset": {"name": "imagefolder", "path": "photos", "image_size": 64},
            "recipe": {"iterations": 10},
        }
    )
    info = DatasetInfo("imagefolder", ("a", "b"), 3, (64, 64), (0.5,) * 3, (0.25,) * 3)
    used = resolve_defaults(photos, info, CPU)
    assert used.recipe.augmentation == "random_resized_crop"
    given = photos.model_copy(
        update={"recipe": photos.recipe.model_copy(update={"augmentation": "imagenet_scale"})}
    )
    assert resolve_defaults(given, info, CPU).recipe.augmentation == "imagenet_scale"
    line = describe_augmentation(given.recipe, resolve_defaults(given, info, CPU))
    assert line.startswith("augmentation: imagenet_scale (as given)")
