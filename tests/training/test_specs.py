"""Specs reject what they cannot run, with a message per field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from training.specs import TrainSpec

GOOD: dict[str, Any] = {
    "model": {"name": "resnet20"},
    "dataset": {"name": "digits"},
    "recipe": {"epochs": 5},
}


def _with(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


def test_a_good_spec_takes_the_papers_defaults() -> None:
    spec = TrainSpec.model_validate(GOOD)
    assert (spec.recipe.epochs, spec.recipe.lr, spec.recipe.schedule) == (5, 0.1, "multistep")
    assert spec.dataset.name == "digits"


@pytest.mark.parametrize(
    ("payload", "location", "message"),
    [
        (_with(model={"name": "resnet21"}), ("model",), "depth must be 6n+2"),
        (_with(model={"name": "resnet20", "options": {"shortcut": "Z"}}), ("model",), "A, B, C"),
        (_with(dataset={"name": "imagenet"}), ("dataset",), "does not match any of the expected"),
        (
            _with(dataset={"name": "digits", "validation": 0.9}),
            ("dataset", "digits", "validation"),
            "less than or equal to 0.5",
        ),
        (_with(recipe={"lr": -1}), ("recipe", "lr"), "greater than 0"),
        (_with(recipe={"epochs": 1, "iterations": 5}), ("recipe",), "not both"),
        (_with(recipe={"milestones": [0.8, 0.5]}), ("recipe",), "increasing"),
        (_with(recipe={"learning_rate": 0.1}), ("recipe", "learning_rate"), "Extra inputs"),
        (_with(recipe={"augment_pad": 33}), ("recipe", "augment_pad"), "'auto' or a whole"),
        (_with(recipe={"augment_pad": "wide"}), ("recipe", "augment_pad"), "0..32"),
        (_with(recipe={"augment_flip": "maybe"}), ("recipe", "augment_flip"), "'auto', true"),
        (_with(colour="red"), ("colour",), "Extra inputs"),
        (
            _with(dataset={"name": "imagefolder", "path": "../etc"}),
            ("dataset", "imagefolder", "path"),
            "relative to the data root",
        ),
    ],
)
def test_bad_specs_name_the_field(
    payload: dict[str, Any], location: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ValidationError) as excinfo:
        TrainSpec.model_validate(payload)
    errors = excinfo.value.errors()
    assert any(e["loc"] == location and message in e["msg"] for e in errors), errors


def test_augmentation_defaults_to_auto_and_explicit_values_load_unchanged() -> None:
    recipe = TrainSpec.model_validate(GOOD).recipe
    assert (recipe.augment_pad, recipe.augment_flip, recipe.channels_last) == ("auto", "auto", None)
    # A spec written before the auto defaults names ints and bools: they load as they were.
    old = _with(recipe={"augment_pad": 4, "augment_flip": True, "channels_last": False})
    spec = TrainSpec.model_validate(old)
    assert (spec.recipe.augment_pad, spec.recipe.augment_flip) == (4, True)
    assert spec.recipe.channels_last is False
    assert TrainSpec.model_validate_json(spec.model_dump_json()) == spec
