"""The papers' recipe: budget, learning-rate schedule and warm-up."""

from __future__ import annotations

import pytest
import torch

from training.recipe import (
    learning_rate,
    make_optimizer,
    total_iterations,
    uses_paper_warmup,
    warmup_over,
)
from training.specs import ModelSpec, RecipeSpec


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
