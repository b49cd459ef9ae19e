"""GET /models/options: the options of the zoo's nets, read from `models` so they cannot drift."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from models.config import (
    BLOCKS,
    SHORTCUT_OPTIONS,
    SHORTCUT_VARIANTS,
    STRIDE_ON,
    UNITS,
    UnitConfig,
)
from models.zoo import FAMILIES, OPTIONS, VARIANT_OPTIONS

API = "/api/v1"


def _options(client: TestClient) -> dict[str, dict[str, Any]]:
    response = client.get(f"{API}/models/options")
    assert response.status_code == 200, response.text
    return {option["name"]: option for option in response.json()["options"]}


def test_the_families_and_options_are_those_of_models_build(client: TestClient) -> None:
    assert client.get(f"{API}/models/options").json()["families"] == list(FAMILIES)
    options = _options(client)
    assert list(options) == list(OPTIONS)
    choices = {
        name: [choice["value"] for choice in option["choices"]]
        for name, option in options.items()
        if option["kind"] == "choice"
    }
    assert choices == {
        "block": list(BLOCKS),
        "unit": list(UNITS),
        "shortcut": list(SHORTCUT_OPTIONS),
        "shortcut_variant": list(SHORTCUT_VARIANTS),
        "stride_on": list(STRIDE_ON),
    }
    assert all(choice["label"] for name in choices for choice in options[name]["choices"])


def test_each_option_says_its_default_and_the_nets_it_applies_to(client: TestClient) -> None:
    options = _options(client)
    unit = UnitConfig()
    numbers = {name: o for name, o in options.items() if o["kind"] == "number"}
    assert {name: o["default"] for name, o in numbers.items()} == {
        name: getattr(unit, name) for name in VARIANT_OPTIONS
    }
    assert {name: o["shortcut_variants"] for name, o in numbers.items()} == {
        name: list(variants) for name, variants in VARIANT_OPTIONS.items()
    }
    assert options["shortcut_variant"]["default"] == unit.shortcut_variant
    assert options["stride_on"]["default"] == unit.stride_on == "3x3"
    assert options["unit"]["default"] is None  # full_preact for preact_resnet, else original
    assert options["unit"]["families"] == list(FAMILIES)
    assert "plain" not in options["shortcut"]["families"]  # plain nets have no shortcuts
    assert "conv1x1" not in options["shortcut"]["shortcut_variants"]
    assert options["gate_bias"] == {
        "name": "gate_bias",
        "kind": "number",
        "description": "The gate's bias at init (gating); a negative one favours the shortcut",
        "default": -6.0,
        "choices": [],
        "families": ["resnet", "preact_resnet"],
        "shortcut_variants": ["exclusive_gating", "shortcut_only_gating"],
    }
    assert options["zero_init_residual"]["default"] is False
