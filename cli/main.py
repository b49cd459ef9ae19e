"""`resnet-service`: the command line of the service (the zoo now; the service later)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

import models

app = typer.Typer(help="Train, evaluate, compare and serve the ResNets of He et al.")


@app.callback()
def main() -> None:
    """Train, evaluate, compare and serve the ResNets of He et al. (2015, 2016)."""


@app.command("models")
def list_zoo(
    names: Annotated[
        list[str] | None, typer.Argument(help="Models to show (any valid name); default all.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    num_classes: Annotated[int, typer.Option(min=1, help="Classifier outputs.")] = 10,
) -> None:
    """The model zoo: every network of both papers with its parameters and MACs."""
    # A pipe or a test runner gets the full table rather than an 80-column squeeze.
    console = Console(width=None if Console().is_terminal else 120)
    with console.status("Counting parameters and MACs..."):
        try:
            rows = [
                models.describe(n, num_classes=num_classes) for n in names or models.list_models()
            ]
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="NAMES") from error
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"ResNet model zoo ({num_classes} classes, MACs per image)")
    for column in ("name", "family", "input", "depth", "block", "unit", "params", "MACs"):
        numeric = column in ("depth", "params", "MACs")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=True)
    for row in rows:
        size = row["default_input_size"]
        table.add_row(
            row["name"],
            row["family"],
            f"{row['stem']} {size}x{size}",
            str(row["depth"]),
            row["block"],
            row["unit"],
            f"{row['params']:,}",
            _si(row["macs"]),
        )
    console.print(table)


def _si(value: int) -> str:
    """1234567 -> '1.23M'."""
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= threshold:
            return f"{value / threshold:.2f}{suffix}"
    return str(value)
