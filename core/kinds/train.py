"""The train kind: train a net of the zoo on a dataset with a recipe, in the job's folder."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from sqlalchemy.orm import Session

import models
from core import admission, artifacts, resources
from core.errors import InvalidError
from core.kinds.base import JobKind, RowFacts, RunContext
from core.resources import ResourcesSpec
from core.settings import Settings, get_settings
from training import runs
from training.data import LoadedDataset
from training.recipe import total_iterations
from training.specs import TrainSpec


class TrainJobSpec(TrainSpec):
    """Train a model: {"kind": "train", "model": {...}, "dataset": {...}, "recipe": {...}}."""

    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="What the job needs of a worker; the stored spec has it filled in.",
    )

    @model_validator(mode="after")
    def _within_budgets(self) -> TrainJobSpec:
        # Every job spec passes here (a submission, a study's cells, a worker's delivery),
        # so no spec reaches a worker that would take more than the process's budgets.
        try:
            costs = admission.check_train(self, admission.shape_of(self.dataset), get_settings())
        except InvalidError as error:
            raise ValueError(error.message) from None
        # The spec states what it uses: the default resources follow the job's compute.
        object.__setattr__(self, "resources", resources.resolve(self.resources, macs=costs.macs))
        return self


def training_spec(stored: dict[str, Any]) -> TrainSpec:
    """The run's part of a stored train job spec, as the engine takes it (no resources)."""
    fields = TrainSpec.model_fields
    return TrainSpec.model_validate({key: value for key, value in stored.items() if key in fields})


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
        training_spec(spec.model_dump()),
        data_root=settings.data_dir,
        out_dir=artifacts.job_dir(settings, context.job_id),
        sink=context.sink,
        device=context.device,
        download=settings.allow_downloads,
        resume=True,
        prepare=lambda data: context.set_budget(*budget(spec, data, settings)),
        free_margin=settings.checkpoint_free_margin_bytes,
        nproc=processes(spec),
    )


def processes(spec: TrainJobSpec) -> int:
    """The processes that train the job: one per GPU it needs, as one DistributedDataParallel
    run on its worker's devices (on a worker that has none, as many CPU processes)."""
    return max(1, spec.resources.gpus or 1)


def budget(spec: TrainJobSpec, data: LoadedDataset, settings: Settings) -> tuple[int, float]:
    """The run's training steps and multiply-accumulates per step, within the budgets."""
    recipe, info = spec.recipe, data.info
    shape = admission.DataShape(
        info.channels, max(info.image_size), info.num_classes, len(data.train)
    )
    admission.check_train(spec, shape, settings)  # the data as read: an ImageFolder's too
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
