"""The `resnet-service` command line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

import models
from cli.main import app

runner = CliRunner()


def test_models_prints_the_zoo_as_a_table() -> None:
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[1]: line for line in result.output.splitlines() if line.startswith("│")}
    assert set(lines) == set(models.list_models())
    assert lines["resnet20"].split("│")[7:9] == ["    269,722 ", "  40.55M "]
    assert "1,703,258" in lines["preact_resnet164"]


def test_models_json_carries_params_and_macs() -> None:
    args = ["models", "resnet56", "resnet18", "--json", "--num-classes", "100"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert set(rows) == {"resnet56", "resnet18"}
    assert rows["resnet56"]["num_classes"] == 100
    # 100 classes: 64 * 90 more classifier weights and 90 more biases than at 10.
    assert rows["resnet56"]["params"] == 853_018 + 65 * 90
    assert rows["resnet18"]["default_input_size"] == 224


def test_models_rejects_a_bad_class_count() -> None:
    result = runner.invoke(app, ["models", "--num-classes", "0"])
    assert result.exit_code == 2


def test_models_names_an_unknown_model() -> None:
    result = runner.invoke(app, ["models", "resnet21"])
    assert result.exit_code == 2
    assert "depth must be 6n+2" in result.output
