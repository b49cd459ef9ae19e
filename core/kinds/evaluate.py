"""The evaluate kind: evaluate a checkpoint of a finished train job on a dataset split."""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from core import admission, artifacts, resources
from core.db.session import session_scope
from core.db.tables import Job
from core.errors import InvalidError, NotFoundError
from core.kinds.base import KINDS, JobKind, RowFacts, RunContext, trains
from core.kinds.reads import check_dataset
from core.owners import Caller
from core.resources import ResourcesSpec
from core.settings import Settings
from training.evaluate import Evaluation
from training.runs import evaluate_checkpoint, json_safe
from training.specs import INT32_MAX, DatasetSpec, Spec, Tag
from training.views import View


class EvaluateJobSpec(Spec):
    """Evaluate a checkpoint of a finished train job on a dataset split."""

    kind: Literal["evaluate"]
    name: str | None = Field(None, max_length=200)
    tags: tuple[Tag, ...] = Field((), max_length=20)
    source_job: uuid.UUID = Field(description="The train job whose checkpoint is evaluated.")
    checkpoint: Literal["best", "last"] | Annotated[int, Field(ge=0, le=INT32_MAX)] = Field(
        "best", description="best, last, or a step number."
    )
    dataset: DatasetSpec
    tta: bool = Field(False, description="Average with the horizontally flipped view.")
    view: View = Field(
        "center",
        description="How each image is seen: center (the checkpoint's preprocessing), "
        "ten_crop (corners and centre, and mirrors: 2015 Tables 2-4) or multi_scale (the "
        "whole image at shorter sides 224..640, fully convolutional: Table 5).",
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="What the job needs of a worker (default any: one pass over the split); "
        "the stored spec has it filled in.",
    )

    @model_validator(mode="after")
    def _one_device(self) -> EvaluateJobSpec:
        object.__setattr__(self, "resources", resources.one_device(self.resources, "an evaluation"))
        return self


def record(
    session: Session, settings: Settings, spec: EvaluateJobSpec
) -> tuple[EvaluateJobSpec, RowFacts]:
    """The spec as given, the source job's net and the dataset; the source must be a
    succeeded job that trained its net, evaluated on the dataset's images within the memory
    budget."""
    source = session.get(Job, spec.source_job)
    where = ("body", "source_job")
    if source is None or not trains(source.kind):
        raise InvalidError(
            f"source_job {spec.source_job} is not a train job of this service", field=where
        )
    if source.status != "succeeded":
        raise InvalidError(
            f"source_job {spec.source_job} is {source.status}, not succeeded", field=where
        )
    return spec, facts_of(source, spec.dataset, settings)


def check_access(
    session: Session, settings: Settings, spec: EvaluateJobSpec, caller: Caller
) -> None:
    """A 422 unless the caller may read the source job (else it is told none exists, as
    for a job that does not) and the dataset."""
    owner = session.scalar(select(Job.owner_key_id).where(Job.id == spec.source_job))
    if not caller.sees(owner):
        raise InvalidError(
            f"source_job {spec.source_job} is not a train job of this service",
            field=("body", "source_job"),
        )
    check_dataset(session, settings, spec.dataset, caller)


def facts_of(source: Job, dataset: DatasetSpec, settings: Settings) -> RowFacts:
    """The row facts of a job that runs `source`'s net over `dataset`, once that net is
    checked to fit the memory budget of `settings` on the dataset's images."""
    made = KINDS[source.kind].net
    if made is None:
        raise InvalidError(f"job {source.id} is a {source.kind} job: it holds no net to run")
    net, classes = made(source.spec)
    shape = dataclasses.replace(admission.shape_of(dataset), num_classes=classes)
    admission.check_evaluate(net, shape, settings)
    return RowFacts(
        dataset_name=dataset.name,
        model_name=source.model_name,
        model_family=source.model_family,
        depth=source.depth,
        source_job_id=source.id,
    )


def run(spec: EvaluateJobSpec, context: RunContext) -> dict[str, Any]:
    """Evaluate the source job's checkpoint (verified by its sha256); returns the summary."""
    settings, sink = context.settings, context.sink
    with session_scope(settings.database_url) as session:
        row = artifacts.find_checkpoint(
            session=session, job_id=spec.source_job, which=spec.checkpoint
        )
        source = session.get(Job, spec.source_job)
    if row is None or source is None:
        raise NotFoundError(f"job {spec.source_job} has no {spec.checkpoint} checkpoint")
    split = spec.dataset.split
    sink.on_event(
        "info",
        f"evaluating {Path(row.path).name} (step {row.step}) of job {spec.source_job} "
        f"on {spec.dataset.name} ({split}, {spec.view} view)",
    )
    started = time.perf_counter()
    result = evaluate_checkpoint(
        artifacts.local_file(settings, row.path, row.sha256),  # fetched first from a bucket
        spec.dataset,
        data_root=settings.data_dir,
        device=context.device,
        tta_flip=spec.tta,
        download=settings.allow_downloads,
        sha256=row.sha256,
        view=spec.view,
        prepare=context.set_data,
    )
    sink.on_metrics(row.step, float(row.epoch), metrics(result, split))
    test_error = result.error if split == "test" else None
    summary: dict[str, Any] = json_safe(
        {
            "source_job": str(spec.source_job),
            "checkpoint": {"step": row.step, "name": Path(row.path).name, "sha256": row.sha256},
            "dataset": spec.dataset.name,
            "split": split,
            "final_test_error": test_error,
            "best_test_error": test_error,
            "params": source.params,
            "macs": source.macs,
            "wall_time_s": time.perf_counter() - started,
            **result.as_dict(),
        }
    )
    return summary


def metrics(result: Evaluation, split: str) -> dict[str, float]:
    """An evaluation as metric points: loss, errors, ECE and each class's accuracy."""
    values = {
        f"{split}/loss": result.loss,
        f"{split}/error": result.error,
        f"{split}/top5_error": result.top5_error,
        f"{split}/ece": result.ece,
    }
    for index, accuracy in enumerate(result.per_class_accuracy):
        values[f"{split}/class_accuracy/{index}"] = accuracy
    return values


KIND = JobKind(
    name="evaluate",
    description="Evaluate a checkpoint of a succeeded train job on a dataset split.",
    spec=EvaluateJobSpec,
    record=record,
    run=run,
    check=check_access,
    server_paths=(("summary", "checkpoint", "path"),),
)
