"""The predict kind: a model's top-k classes for every image of a dataset split, as files.

The model reference (a train job id, `name`, `name/3` or `name@alias`) is resolved on
submission and the checkpoint it names pinned in the stored spec (`resolved`): moving an
alias later changes nothing about a queued or finished job. The run writes
`predictions.csv` and/or `predictions.jsonl`, and `confusion.json` when the dataset's
classes are the model's (`training.batch_predict`), into the job's folder, puts them to the
object store when there is one, and lists them (name, bytes, sha256) in its summary's
`artifacts`. A retried predict job starts over and rewrites its files whole.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from sqlalchemy.orm import Session

import models
from core import admission, artifacts, model_registry, resources
from core.db.tables import Job
from core.errors import ConflictError, InvalidError, NotFoundError
from core.kinds.base import JobKind, RowFacts, RunContext
from core.kinds.evaluate import facts_of
from core.kinds.reads import check_dataset
from core.owners import ANYONE, Caller
from core.resources import ResourcesSpec
from core.settings import Settings
from training.batch_predict import (
    Format,
    Images,
    Prediction,
    explain_split,
    images_of,
    predict_split,
)
from training.checkpoints import sha256_of
from training.predictor import Predictor
from training.runs import json_safe, load_trained_model
from training.specs import INT32_MAX, DatasetSpec, Spec, Tag


class PinnedModel(Spec):
    """The checkpoint a model reference named on submission: what the job runs."""

    ref: str
    job_id: uuid.UUID
    model: str | None = None
    version: int | None = None
    step: int = Field(ge=0, le=INT32_MAX)
    path: str
    sha256: str


MAX_EXPLAINED = 256  # overlays one job writes at most


class BatchExplain(Spec):
    """Grad-CAM heatmaps of the split's first images, written beside the predictions."""

    images: int = Field(
        16, ge=1, le=MAX_EXPLAINED, description="The first N images, in file order."
    )
    target: Literal["top", "label"] = Field(
        "top", description="The class explained: each image's top class, or its label."
    )


class PredictJobSpec(Spec):
    """Predict the classes of every image of a dataset split with a model."""

    kind: Literal["predict"]
    name: str | None = Field(None, max_length=200)
    tags: tuple[Tag, ...] = Field((), max_length=20)
    model: str = Field(
        max_length=300,
        description="A train job id, or a registered model: name, name/VERSION, name@ALIAS.",
    )
    dataset: DatasetSpec
    top_k: int = Field(5, ge=1, le=100, description="Classes a row names (at most all).")
    batch_size: int = Field(
        256, ge=1, le=admission.EVALUATE_BATCH, description="Images per forward pass."
    )
    format: Literal["csv", "jsonl", "both"] = Field(
        "csv", description="csv: top-k per row; jsonl: also every class's probability."
    )
    explain: BatchExplain | None = Field(
        None,
        description="Also write Grad-CAM overlays (heatmap-NNNNN.png) and heatmaps.npz for "
        "the first images; true: the first 16, for their top class.",
    )
    resolved: PinnedModel | None = Field(
        None, description="Filled in on submission: the checkpoint `model` named then."
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="What the job needs of a worker (default any: one pass over the split); "
        "the stored spec has it filled in.",
    )

    @field_validator("explain", mode="before")
    @classmethod
    def _explain_shorthand(cls, value: object) -> object:
        """`true` is the default explanation, `false` none."""
        if isinstance(value, bool):
            return {} if value else None
        return value

    @model_validator(mode="after")
    def _one_device(self) -> PredictJobSpec:
        object.__setattr__(self, "resources", resources.one_device(self.resources, "a prediction"))
        return self

    @property
    def formats(self) -> tuple[Format, ...]:
        """The files the job writes, by format."""
        return ("csv", "jsonl") if self.format == "both" else (self.format,)


def resolve_model(session: Session, ref: str, caller: Caller = ANYONE) -> model_registry.Resolved:
    """What `ref` names if the caller may read it; else `InvalidError` saying why not."""
    where = ("body", "model")
    try:
        target = model_registry.resolve(session=session, ref=ref)
        target.check_visible(caller)
    except (NotFoundError, ConflictError, InvalidError) as error:
        raise InvalidError(error.message, field=where) from None
    return target


def check_access(
    session: Session, settings: Settings, spec: PredictJobSpec, caller: Caller
) -> None:
    """A 422 unless the caller may read the model and the dataset the spec names."""
    resolve_model(session, spec.model, caller)
    check_dataset(session, settings, spec.dataset, caller)


def record(
    session: Session, settings: Settings, spec: PredictJobSpec
) -> tuple[PredictJobSpec, RowFacts]:
    """The spec with the checkpoint the reference names now pinned; the model's net and the
    dataset."""
    target = resolve_model(session, spec.model)
    source = session.get(Job, target.job_id)
    if source is None:
        raise InvalidError(f"the job of {spec.model!r} is gone", field=("body", "model"))
    facts = facts_of(source, spec.dataset, settings)
    pinned = PinnedModel(
        ref=spec.model,
        job_id=target.job_id,
        model=target.model,
        version=target.version,
        step=target.step,
        path=target.path,
        sha256=target.sha256,
    )
    return spec.model_copy(update={"resolved": pinned}), facts  # the stored spec holds what runs


def run(spec: PredictJobSpec, context: RunContext) -> dict[str, Any]:
    """Predict every image of the split with the pinned checkpoint (verified by its sha256),
    writing the files into the job's folder (and the object store); returns the summary."""
    settings, sink, pinned = context.settings, context.sink, spec.resolved
    # Only files the service wrote are ever opened, never a path from elsewhere.
    if pinned is None or not artifacts.is_stored(settings, pinned.path):
        raise InvalidError(f"job {context.job_id}: its spec names no checkpoint of the service")
    path = artifacts.local_file(settings, pinned.path, pinned.sha256)  # fetched from a bucket
    predictor = Predictor(path, sha256=pinned.sha256, device=context.device, fold=True)
    images = images_of(
        spec.dataset,
        predictor,
        data_root=settings.data_dir,
        download=settings.allow_downloads,
        prepare=context.set_data,
    )
    context.set_budget(len(images), _macs_per_image(predictor))
    split = spec.dataset.split
    sink.on_event(
        "info",
        f"predicting {len(images)} images of {spec.dataset.name} ({split}) with {pinned.ref} "
        f"(job {pinned.job_id}, step {pinned.step}) on {context.device}",
    )
    started = time.perf_counter()
    out_dir = artifacts.job_dir(settings, context.job_id)
    result = predict_split(
        predictor,
        images,
        out_dir=out_dir,
        formats=spec.formats,
        top_k=spec.top_k,
        batch_size=spec.batch_size,
        sink=sink,
    )
    if result.stopped:
        return {"stopped": True, "images": result.images, "total_images": len(images)}
    if result.error is not None and result.top_k_error is not None:
        sink.on_metrics(
            result.images,
            0.0,
            {
                f"{split}/error": result.error,
                f"{split}/top{result.top_k}_error": result.top_k_error,
            },
        )
    files = result.files
    if spec.explain is not None:
        files = [*files, *_explained(spec.explain, path, pinned.sha256, images, context)]
    listed = [_publish(context, file) for file in files]
    return summary(spec, result, listed, time.perf_counter() - started)


def _explained(
    explain: BatchExplain, path: Path, sha256: str, images: Images, context: RunContext
) -> list[Path]:
    """Grad-CAM of the split's first images on the checkpoint's own net (the served form
    folds its batch norms): the overlays and the arrays, written into the job's folder."""
    trained = load_trained_model(path, sha256=sha256, device=context.device)
    if explain.target == "label" and images.classes != trained.info.classes:
        raise InvalidError(
            "explain.target label needs a dataset whose classes are the model's; use top"
        )
    context.sink.on_event(
        "info", f"explaining the first {min(explain.images, len(images))} images (Grad-CAM)"
    )
    return explain_split(
        trained.model,
        trained.preprocessing,
        images,
        out_dir=artifacts.job_dir(context.settings, context.job_id),
        count=explain.images,
        label=explain.target == "label",
    )


def _macs_per_image(predictor: Predictor) -> float:
    """The net's multiply-accumulates for one image (the worker's time limits)."""
    info, net = predictor.info, predictor.spec["model"]
    described = models.describe(
        net["name"],
        num_classes=info.num_classes,
        in_channels=info.channels,
        input_size=info.image_size[0],
        **net.get("options", {}),
    )
    return float(described["macs"])


def _publish(context: RunContext, file: Path) -> dict[str, Any]:
    """Put a written file to the object store (the local store holds it already); its entry
    in the summary's `artifacts`."""
    sha256 = sha256_of(file)
    artifacts.put_job_file(context.settings, context.job_id, file, sha256)
    return {"name": file.name, "bytes": file.stat().st_size, "sha256": sha256}


def summary(
    spec: PredictJobSpec, result: Prediction, listed: list[dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    """The job's summary: what ran on what, the errors when labelled, and the files."""
    pinned = spec.resolved
    assert pinned is not None
    test_error = result.error if spec.dataset.split == "test" else None
    found: dict[str, Any] = json_safe(
        {
            "model": pinned.model_dump(mode="json", exclude={"path"}),
            "dataset": spec.dataset.name,
            "split": spec.dataset.split,
            "images": result.images,
            "labelled": result.labelled,
            "top_k": result.top_k,
            "error": result.error,
            "top_k_error": result.top_k_error,
            "final_test_error": test_error,
            "best_test_error": test_error,
            "images_per_s": result.images_per_s,
            "wall_time_s": wall_s,
            "artifacts": listed,
        }
    )
    return found


KIND = JobKind(
    name="predict",
    description="Predict the classes of every image of a dataset split with a model.",
    spec=PredictJobSpec,
    record=record,
    run=run,
    check=check_access,
    server_paths=(("spec", "resolved", "path"),),
)
