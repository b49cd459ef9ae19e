"""The train kind: train a net of the zoo on a dataset with a recipe, in the job's folder.

A fine-tune is a train job with an `init`: its model reference is resolved on submission
and the checkpoint it names pinned in the stored spec (`init.resolved`), as a predict job's;
the worker fetches that checkpoint (verified by its sha256) and trains from it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from pydantic import Field, TypeAdapter, ValidationError, ValidationInfo, model_validator
from sqlalchemy.orm import Session

import models
from core import admission, artifacts, model_registry, resources
from core.db.tables import Job
from core.errors import ConflictError, InvalidError, NotFoundError
from core.kinds.base import JobKind, RowFacts, RunContext, settings_of
from core.kinds.reads import check_dataset
from core.owners import ANYONE, Caller
from core.resources import ResourcesSpec
from core.settings import Settings
from training import finetune, runs
from training.data import LoadedDataset
from training.options import RunOptions
from training.recipe import total_iterations
from training.specs import DatasetSpec, ModelSpec, PinnedInit, TrainSpec


class TrainJobSpec(TrainSpec):
    """Train a model: {"kind": "train", "model": {...}, "dataset": {...}, "recipe": {...}}."""

    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="What the job needs of a worker; the stored spec has it filled in.",
    )

    @model_validator(mode="after")
    def _within_budgets(self, info: ValidationInfo) -> TrainJobSpec:
        # Every job spec is parsed with the settings of the process that parses it (a
        # submission, a study's cells, a worker's delivery: `JobKind.parse`), so no spec
        # reaches a worker that would take more than that process's budgets.
        settings, shape = settings_of(info), admission.shape_of(self.dataset)
        try:
            if settings is None:
                costs = admission.costs(self, shape)
            else:
                costs = admission.check_train(self, shape, settings)
        except InvalidError as error:
            raise ValueError(error.message) from None
        # The spec states what it uses: the default resources follow the job's compute.
        object.__setattr__(self, "resources", resources.resolve(self.resources, macs=costs.macs))
        return self


def training_spec(stored: dict[str, Any]) -> TrainSpec:
    """The run's part of a stored train job spec, as the engine takes it (no resources)."""
    fields = TrainSpec.model_fields
    return TrainSpec.model_validate({key: value for key, value in stored.items() if key in fields})


INIT_FIELD = ("body", "init", "source")


def resolve_init(session: Session, ref: str, caller: Caller = ANYONE) -> model_registry.Resolved:
    """What a fine-tune's `init.source` names if the caller may read it; else a 422."""
    try:
        target = model_registry.resolve(session=session, ref=ref)
        target.check_visible(caller)
    except (NotFoundError, ConflictError, InvalidError) as error:
        raise InvalidError(f"init.source {ref!r}: {error.message}", field=INIT_FIELD) from None
    return target


def check_access(session: Session, settings: Settings, spec: TrainJobSpec, caller: Caller) -> None:
    """A 422 unless the caller may read the dataset and the checkpoint a fine-tune starts
    from."""
    check_dataset(session, settings, spec.dataset, caller)
    if spec.init is not None:
        resolve_init(session, spec.init.source, caller)


def check_stored(
    session: Session, settings: Settings, specs: Iterable[dict[str, Any]], caller: Caller
) -> None:
    """`check_access` for train specs as stored (a study's jobs), once per distinct dataset
    and init source."""
    seen: set[str] = set()
    for spec in specs:
        init = spec.get("init") or {}
        key = json.dumps([spec.get("dataset"), init.get("source")], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        dataset = _DATASET.validate_python(spec.get("dataset"))
        check_dataset(session, settings, dataset, caller)
        if init.get("source") is not None:
            resolve_init(session, init["source"], caller)


_DATASET: TypeAdapter[DatasetSpec] = TypeAdapter(DatasetSpec)


def net_of(stored: dict[str, Any]) -> tuple[ModelSpec, int]:
    """The net a train job's checkpoints hold, and its classes (its dataset's)."""
    trained = training_spec(stored)
    return trained.model, admission.shape_of(trained.dataset).num_classes


def record(
    session: Session, _settings: Settings, spec: TrainJobSpec
) -> tuple[TrainJobSpec, RowFacts]:
    """The spec with a fine-tune's checkpoint pinned; the net's name, family and depth, the
    dataset and a fine-tune's source job."""
    pinned, source = _pin_init(session, spec)
    name = spec.model.name
    return pinned, RowFacts(
        dataset_name=spec.dataset.name,
        model_name=name,
        model_family=models.parse_name(name).family,
        depth=models.resolve(name, **spec.model.options).depth,
        source_job_id=source,
    )


def _pin_init(session: Session, spec: TrainJobSpec) -> tuple[TrainJobSpec, uuid.UUID | None]:
    """The spec with the checkpoint `init.source` names now pinned (moving an alias later
    changes nothing), and the source job's id. A 422 when the net is not the source's."""
    if spec.init is None:
        return spec, None
    target = resolve_init(session, spec.init.source)
    source = session.get(Job, target.job_id)
    if source is None:
        raise InvalidError(f"init.source {spec.init.source!r}: its job is gone", field=INIT_FIELD)
    net = _net_of(source)
    if net is not None:
        try:
            finetune.check_model(spec.model, net, f"init.source {spec.init.source!r}")
        except ValueError as error:
            raise InvalidError(str(error), field=("body", "model")) from None
    pinned = PinnedInit(
        job_id=target.job_id,
        model=target.model,
        version=target.version,
        step=target.step,
        sha256=target.sha256,
        path=target.path,
    )
    init = spec.init.model_copy(update={"resolved": pinned})  # the stored spec holds what runs
    return spec.model_copy(update={"init": init}), target.job_id


def _net_of(job: Job) -> ModelSpec | None:
    """The net a job's checkpoints hold, where its spec says (a train job's does); None
    leaves the check to the worker, which reads the checkpoint's."""
    try:
        return ModelSpec.model_validate(job.spec.get("model"))
    except ValidationError:
        return None


def run(spec: TrainJobSpec, context: RunContext) -> dict[str, Any]:
    """Train in the job's folder, resuming from its latest checkpoint; returns the summary."""
    settings = context.settings
    options = RunOptions(
        out_dir=artifacts.job_dir(settings, context.job_id),
        data_root=settings.data_dir,
        device=context.device,
        download=settings.allow_downloads,
        resume=True,
        prepare=lambda data: _prepare(spec, data, context),
        free_margin=settings.checkpoint_free_margin_bytes,
    )
    train_spec = _with_init_file(training_spec(spec.model_dump()), settings)
    return runs.train(train_spec, options, context.sink, nproc=processes(spec))


def _prepare(spec: TrainJobSpec, data: LoadedDataset, context: RunContext) -> None:
    """Before training: the worker's time limits, and the row's record of the data."""
    context.set_budget(*budget(spec, data, context.settings))
    context.set_data(data)


def _with_init_file(spec: TrainSpec, settings: Settings) -> TrainSpec:
    """A fine-tune's spec with its pinned checkpoint as a local file (fetched from the object
    store and verified there); only checkpoints the service wrote are ever opened."""
    if spec.init is None:
        return spec
    pinned = spec.init.resolved
    if pinned is None or pinned.path is None or pinned.sha256 is None:
        raise InvalidError("the fine-tune's spec names no pinned checkpoint of the service")
    if not artifacts.is_stored(settings, pinned.path):
        raise InvalidError(f"init checkpoint {pinned.path} is not a file of the service")
    local = artifacts.local_file(settings, pinned.path, pinned.sha256)
    resolved = pinned.model_copy(update={"path": str(local)})
    return spec.model_copy(update={"init": spec.init.model_copy(update={"resolved": resolved})})


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
    net=net_of,
    trains=training_spec,
    check=check_access,
    server_paths=(("spec", "init", "resolved", "path"),),
)
