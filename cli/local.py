"""Local commands, with no service: `models` (the zoo), `train` and `evaluate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.table import Table

import models
from cli.formatting import facts, pairs, percent, si
from cli.run_sinks import ProgressSink
from cli.train_options import (
    DatasetFields,
    DatasetName,
    Epochs,
    Init,
    InitFields,
    Iterations,
    ModelName,
    ModelOptions,
    RecipeFields,
    train_spec,
)
from core.settings import get_settings
from training import distributed, runs
from training.options import RunOptions
from training.specs import DatasetSpec, TrainSpec
from training.views import View

Nproc = Annotated[
    int,
    typer.Option(
        min=1,
        help="Processes on this host, one device each (DistributedDataParallel: NCCL on "
        "GPUs, gloo on CPUs); the batch size is the global batch.",
    ),
]
Nnodes = Annotated[int, typer.Option(min=1, envvar="NNODES", help="Hosts in the run.")]
NodeRank = Annotated[
    int, typer.Option(min=0, envvar="NODE_RANK", help="This host's place, 0..nnodes-1.")
]
MasterAddr = Annotated[
    str, typer.Option(envvar="MASTER_ADDR", help="Address of the host of rank 0 (node 0).")
]
MasterPort = Annotated[
    int,
    typer.Option(
        min=0, max=65535, envvar="MASTER_PORT", help="Its port; 0: any free one (one host)."
    ),
]


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
            si(row["macs"]),
        )
    console.print(table)


def _spec_or_exit(payload: dict[str, Any]) -> TrainSpec:
    """The validated spec; otherwise print each invalid field and exit 2."""
    try:
        return TrainSpec.model_validate(payload)
    except ValidationError as error:
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"])
            typer.echo(f"error: {where}: {problem['msg']}", err=True)
        raise typer.Exit(2) from error


def train(
    model: ModelName = "resnet20",
    dataset: DatasetName = "digits",
    out: Annotated[Path, typer.Option(help="Run folder: checkpoints, metrics, summary.")] = Path(
        "var/runs/latest"
    ),
    epochs: Epochs = None,
    iterations: Iterations = None,
    option: ModelOptions = None,
    dataset_option: DatasetFields = None,
    recipe: RecipeFields = None,
    init: Init = None,
    init_option: InitFields = None,
    spec_file: Annotated[
        Path | None, typer.Option("--spec", help="A whole train spec as JSON instead.")
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="cpu, cuda, cuda:1; default: cuda if any.")
    ] = None,
    data_root: Annotated[Path | None, typer.Option(help="Default: DATA_DIR.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the run folder's checkpoint.")] = True,
    nproc: Nproc = 1,
    nnodes: Nnodes = 1,
    node_rank: NodeRank = 0,
    master_addr: MasterAddr = "127.0.0.1",
    master_port: MasterPort = 0,
) -> None:
    """Train a model locally, with no server; ends with a summary table."""
    payload = (
        json.loads(spec_file.read_text())
        if spec_file is not None
        else train_spec(
            model=model,
            dataset=dataset,
            epochs=epochs,
            iterations=iterations,
            options=option,
            dataset_fields=dataset_option,
            recipe=recipe,
            init=init,
            init_fields=init_option,
        )
    )
    spec = _spec_or_exit(payload)
    settings = get_settings()
    console = Console()
    try:
        meet = distributed.Rendezvous(master_addr, master_port, nnodes, node_rank)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--nnodes/--master-port") from error
    options = RunOptions(
        out_dir=out,
        data_root=data_root or settings.data_dir,
        device=torch.device(device) if device else None,
        download=settings.allow_downloads,
        resume=resume,
    )
    with ProgressSink(out, console) as sink:
        if nproc * nnodes > 1:
            summary = distributed.train(spec, options, sink, nproc=nproc, rendezvous=meet)
        else:
            summary = runs.train(spec, options, sink)
    if node_rank > 0:
        console.print(f"node {node_rank}: its ranks are done; node 0 holds the run folder")
        return
    table = facts(
        f"{spec.model.name} on {summary['dataset']}",
        ("steps", f"{summary['steps']:,} / {summary['total_steps']:,}"),
        ("params", f"{summary['params']:,}"),
        ("MACs / image", si(summary["macs"])),
        ("final test error", percent(summary["final_test_error"])),
        ("best test error", percent(summary["best_test_error"])),
        ("train images/s", f"{summary['images_per_s'] or 0:,.0f}"),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
        *_spread(summary.get("distributed")),
        ("run folder", str(out)),
    )
    console.print(table)


def _spread(facts: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The table row of a run on several processes; none for one process."""
    if facts is None:
        return []
    per_rank = f"{facts['per_rank_batch']} of the global batch {facts['global_batch']} each"
    return [("processes", f"{facts['world_size']} ({facts['backend']}), {per_rank}")]


def evaluate(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint file (step-N.pt, best.pt).")],
    dataset: Annotated[str, typer.Option(help="Dataset name.")] = "digits",
    split: Annotated[str, typer.Option(help="train, val or test.")] = "test",
    dataset_option: DatasetFields = None,
    tta: Annotated[bool, typer.Option(help="Average with the flipped view.")] = False,
    view: Annotated[
        View, typer.Option(help="center, ten_crop (2015 Tables 2-4) or multi_scale (Table 5).")
    ] = "center",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    device: Annotated[str | None, typer.Option(help="cpu, cuda; default: cuda if any.")] = None,
    data_root: Annotated[Path | None, typer.Option(help="Default: DATA_DIR.")] = None,
) -> None:
    """Evaluate a checkpoint: error, top-5, per-class accuracy, calibration."""
    payload = {"name": dataset, "split": split, **pairs(dataset_option, "--dataset-option")}
    try:
        dataset_spec = TypeAdapter(DatasetSpec).validate_python(payload)
        result = runs.evaluate_checkpoint(
            checkpoint,
            dataset_spec,
            data_root=data_root or get_settings().data_dir,
            device=torch.device(device) if device else None,
            tta_flip=tta,
            view=view,
        )
    except (ValidationError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from error
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    table = facts(
        f"{checkpoint} on {dataset} ({split}, {view} view)",
        ("images", f"{result.count:,}"),
        ("loss", f"{result.loss:.4f}"),
        ("top-1 error", percent(result.error)),
        ("top-5 error", percent(result.top5_error)),
        ("calibration error (ECE)", f"{result.ece:.4f}"),
        ("images/s", f"{result.images_per_s:,.0f}"),
    )
    per_class = Table(title="per-class accuracy")
    per_class.add_column("class")
    per_class.add_column("accuracy", justify="right")
    for name, accuracy in zip(result.classes, result.per_class_accuracy, strict=True):
        per_class.add_row(name, percent(accuracy))
    console = Console()
    console.print(table)
    console.print(per_class)
