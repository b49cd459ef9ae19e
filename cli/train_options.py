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
Init = Annotated[
    str | None,
    typer.Option(
        "--init",
        help="Fine-tune from these weights: a checkpoint file (train), a model reference "
        "(submit: job id, name, name/3, name@alias).",
    ),
]
InitFields = Annotated[
    list[str] | None,
    typer.Option(
        "--init-option",
        "-i",
        help="Fine-tuning field key=value: head=auto|keep|reset, freeze=stem,layer1, "
        "backbone_lr=0.1, normalisation=source|data.",
    ),
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
    init: str | None = None,
    init_fields: list[str] | None = None,
) -> dict[str, Any]:
    """The model, dataset, recipe (and init) fields of a train spec, not yet validated."""
    # --epochs and --iterations win over the same fields given with --recipe.
    budget = {k: v for k, v in (("epochs", epochs), ("iterations", iterations)) if v is not None}
    return {
        "model": {"name": model, "options": pairs(options, "--option")},
        "dataset": {"name": dataset, **pairs(dataset_fields, "--dataset-option")},
        "recipe": {**pairs(recipe, "--recipe"), **budget},
        **_init(init, init_fields),
    }


def _init(source: str | None, fields: list[str] | None) -> dict[str, Any]:
    """The spec's `init` where `--init` names weights; `-i` alone is an error."""
    if source is None:
        if fields:
            raise typer.BadParameter("needs --init to name the weights", param_hint="--init-option")
        return {}
    return {"init": {"source": source, **pairs(fields, "--init-option")}}
