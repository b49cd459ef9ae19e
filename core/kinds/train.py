"""The train kind: train a net of the zoo on a dataset with a recipe, in the job's folder."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

import models
from core import artifacts
from core.kinds.base import JobKind, RowFacts, RunContext
from training import runs
from training.data import LoadedDataset
from training.recipe import total_iterations
from training.specs import TrainSpec


class TrainJobSpec(TrainSpec):
    """Train a model: {"kind": "train", "model": {...}, "dataset": {...}, "recipe": {...}}."""


def record(_session: Session, spec: TrainJobSpec) -> RowFacts:
    """The net's name, family and depth, and the dataset."""
    name = spec.model.name
    return RowFacts(
        dataset_name=spec.dataset.name,
        model_name=name,
        model_family=models.parse_name(name).family,
        depth=models.resolve(name, **spec.model.options).depth,
    )


def run(spec: TrainJobSpec, context: RunContext) -> dict[str, Any]:
    """Train in the job's folder, resuming from its latest checkpoint; returns the summary."""
    settings = context.settings
    return runs.train(
        spec,
        data_root=settings.data_dir,
        out_dir=artifacts.job_dir(settings, context.job_id),
        sink=context.sink,
        device=context.device,
        download=settings.allow_downloads,
        resume=True,
        prepare=lambda data: context.set_budget(*budget(spec, data)),
        free_margin=settings.checkpoint_free_margin_bytes,
    )


def budget(spec: TrainJobSpec, data: LoadedDataset) -> tuple[int, float]:
    """The run's training steps and multiply-accumulates per step."""
    recipe, info = spec.recipe, data.info
    steps = total_iterations(recipe, max(1, len(data.train) // recipe.batch_size))
    described = models.describe(
        spec.model.name,
        num_classes=info.num_classes,
        in_channels=info.channels,
        input_size=info.image_size[0],
        **spec.model.options,
    )
    return steps, float(described["macs"] * recipe.batch_size)


KIND = JobKind(
    name="train",
    description="Train a net of the zoo on a dataset with a recipe.",
    spec=TrainJobSpec,
    record=record,
    run=run,
)
