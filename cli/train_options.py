"""The options that describe a training run, shared by `train` (here) and `submit` (a service).

Each alias declares one option; `train_spec` turns their values into a train spec's fields.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli.formatting import pairs

ModelName = Annotated[str, typer.Option("--model", help="Zoo name, e.g. resnet20.")]
DatasetName = Annotated[str, typer.Option("--dataset", help="Dataset name, e.g. digits, cifar10.")]
Epochs = Annotated[float | None, typer.Option("--epochs", help="Budget in epochs.")]
Iterations = Annotated[int | None, typer.Option("--iterations", help="Budget in iterations.")]
ModelOptions = Annotated[
    list[str] | None, typer.Option("--option", "-o", help="Model option key=value.")
]
DatasetFields = Annotated[
    list[str] | None, typer.Option("--dataset-option", "-d", help="Dataset field key=value.")
]
RecipeFields = Annotated[
    list[str] | None,
    typer.Option("--recipe", "-r", help="Recipe field key=value, e.g. lr=0.05."),
]


def train_spec(
    *,
    model: str,
    dataset: str,
    epochs: float | None,
    iterations: int | None,
    options: list[str] | None,
    dataset_fields: list[str] | None,
    recipe: list[str] | None,
) -> dict[str, Any]:
    """The model, dataset and recipe fields of a train spec, not yet validated."""
    # --epochs and --iterations win over the same fields given with --recipe.
    budget = {k: v for k, v in (("epochs", epochs), ("iterations", iterations)) if v is not None}
    return {
        "model": {"name": model, "options": pairs(options, "--option")},
        "dataset": {"name": dataset, **pairs(dataset_fields, "--dataset-option")},
        "recipe": {**pairs(recipe, "--recipe"), **budget},
    }
