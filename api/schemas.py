"""What the API answers: pydantic models built from ORM rows, never the rows themselves."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from api import search
from core import resources, uploads, workers
from core.db.tables import ApiKey, Checkpoint, Event, Job, Upload
from core.kinds import KINDS, shown
from training.specs import Tag

Scope = Literal["read", "train", "predict", "admin"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
API_PREFIX = "/api/v1"


class ErrorDetail(BaseModel):
    """One problem: where (`loc`, e.g. ["body", "recipe", "lr"]) and what is wrong."""

    loc: list[str | int]
    msg: str


class ErrorBody(BaseModel):
    """A machine-readable code, a message for people, and per-field details."""

    code: str = Field(examples=["invalid"])
    message: str = Field(examples=["recipe.lr: Input should be greater than 0"])
    details: list[ErrorDetail] = Field(default_factory=list)


class ErrorOut(BaseModel):
    """The shape of every error the API answers."""

    error: ErrorBody


class JobLinks(BaseModel):
    """Where to read more about a job, or act on it."""

    self: str
    metrics: str
    events: str
    checkpoints: str
    cancel: str

    @classmethod
    def of(cls, job_id: uuid.UUID) -> JobLinks:
        """The links of job `job_id`."""
        base = f"{API_PREFIX}/jobs/{job_id}"
        return cls(
            self=base,
            metrics=f"{base}/metrics",
            events=f"{base}/events",
            checkpoints=f"{base}/checkpoints",
            cancel=f"{base}/cancel",
        )


class JobProgress(BaseModel):
    """Steps done out of the run's budget (unknown until a worker starts it)."""

    step: int
    total_steps: int | None


class JobResults(BaseModel):
    """The summary columns, set when a job ends (errors are fractions, 0..1)."""

    final_test_error: float | None
    best_test_error: float | None
    params: int | None
    macs: int | None
    wall_time_s: float | None
    images_per_s: float | None


class JobItem(BaseModel):
    """A job as the runs table shows it."""

    id: uuid.UUID
    kind: str = Field(description="A registered job kind (`GET /api/v1/jobs/kinds`).")
    status: JobStatus
    name: str | None
    tags: list[str]
    note: str | None = Field(None, description="Free text, editable (PATCH the job).")
    model: str | None
    family: str | None
    depth: int | None
    dataset: str | None
    data_digest: str | None = Field(
        None,
        description="The digest of the data it read (sha256:<64 hex>), once its worker "
        "loaded it; the list's `filter=data_digest=...` finds every job of one.",
    )
    source_job: uuid.UUID | None
    study: uuid.UUID | None = Field(None, description="The study the job is a cell of.")
    cell: int | None = Field(None, description="Its cell in the study's grid.")
    held: bool = Field(False, description="Queued but waiting for its study's turn.")
    queue: str = Field(
        resources.CPU_QUEUE, description="The queue of what it needs: train, gpu, gpu-N."
    )
    waiting_for: str | None = Field(
        None, description="While queued: the worker it waits for, e.g. 'a worker with a GPU'."
    )
    owner: uuid.UUID | None = Field(
        None, description="The API key that made it (its id); null: made with auth off."
    )
    attempt: int
    max_attempts: int
    worker: str | None
    device: str | None
    error: str | None
    cancel_requested: bool
    progress: JobProgress
    results: JobResults
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    links: JobLinks

    @classmethod
    def of(cls, job: Job) -> JobItem:
        """The runs-table view of a job row."""
        return cls.model_validate(_job_fields(job))


class JobOut(JobItem):
    """A job with its spec and its whole summary (an evaluation's confusion matrix too)."""

    spec: dict[str, Any]
    summary: dict[str, Any] | None
    data: dict[str, Any] | None = Field(
        None,
        description="The data it read: digest, source, classes, split sizes, skipped files.",
    )
    environment: dict[str, Any] | None = Field(
        None,
        description="What it ran on: service version and commit, Python, torch, torchvision, "
        "CUDA, cuDNN, device.",
    )
    updated_at: datetime

    @classmethod
    def of(cls, job: Job) -> JobOut:
        """The full view of a job row."""
        fields = _job_fields(job)
        # Server file paths (a pinned checkpoint's) stay on the server.
        spec, summary = shown(job.kind, "spec", job.spec), shown(job.kind, "summary", job.summary)
        fields.update(spec=spec, summary=summary, updated_at=job.updated_at)
        fields.update(data=job.data, environment=job.environment)
        return cls.model_validate(fields)


def _job_fields(job: Job) -> dict[str, Any]:
    columns = (
        *("id", "kind", "status", "name", "tags", "note", "depth", "attempt", "max_attempts"),
        *("worker", "device", "error", "cancel_requested"),
        *("created_at", "started_at", "finished_at"),
    )
    fields: dict[str, Any] = {column: getattr(job, column) for column in columns}
    results = {key: getattr(job, key) for key in JobResults.model_fields}
    needs = resources.of_spec(job.spec)
    waiting = job.status == "queued" and not job.held
    return fields | {
        "queue": resources.queue_for(needs.gpus or 0),
        "waiting_for": resources.describe(needs) if waiting else None,
        "model": job.model_name,
        "family": job.model_family,
        "dataset": job.dataset_name,
        "data_digest": job.data_digest,
        "source_job": job.source_job_id,
        "study": job.study_id,
        "cell": job.cell,
        "held": job.held,
        "owner": job.owner_key_id,
        "progress": {"step": job.step, "total_steps": job.total_steps},
        "results": results,
        "links": JobLinks.of(job.id),
    }


class RetryOut(BaseModel):
    """A failed or cancelled job queued again, and where its next run starts."""

    job: JobOut
    resume_step: int | None = Field(
        description="The step of the verified checkpoint it resumes from; null: it starts over."
    )
    message: str = Field(examples=["retried: resumes from step-440.pt at step 440"])


class JobState(BaseModel):
    """Where a job is in its life: an event stream's `status` and `progress` events."""

    status: JobStatus
    attempt: int
    cancel_requested: bool
    error: str | None
    step: int
    total_steps: int | None

    @classmethod
    def of(cls, job: Job) -> JobState:
        """The state of a job row."""
        fields = ("status", "attempt", "cancel_requested", "error", "step", "total_steps")
        return cls.model_validate({name: getattr(job, name) for name in fields})


class LogLine(BaseModel):
    """A line of a job's log: an event stream's `log` event (its SSE id is `id`)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime
    level: str
    message: str

    @classmethod
    def of(cls, row: Event) -> LogLine:
        """The view of an event row."""
        return cls.model_validate(row)


class JobSearch(BaseModel):
    """The job list's filters and order (`api.search` has the filter language)."""

    model_config = ConfigDict(extra="forbid")

    status: list[JobStatus] = Field(default_factory=list, description="Any of these statuses.")
    kind: str | None = Field(None, max_length=32, description="A registered job kind.")
    model: str | None = Field(None, max_length=100, description="Zoo name, e.g. resnet56.")
    family: str | None = Field(None, max_length=32, description="resnet, plain, preact_resnet.")
    dataset: str | None = Field(None, max_length=100)
    tag: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=20, description="Jobs with every one of these tags."
    )
    q: str | None = Field(None, max_length=200, description="Text in the job's name.")
    study: uuid.UUID | None = Field(None, description="The jobs of this study.")
    owner: uuid.UUID | Literal["me"] | None = Field(
        None, description="The jobs of this API key (its id), or `me`: the caller's."
    )
    filter: list[Annotated[str, Field(max_length=400)]] = Field(
        default_factory=list,
        max_length=20,
        description="`path op value`, all must hold: best_test_error<0.08, "
        "model.options.unit=full_preact, recipe.lr>=0.1, summary.best_train_error<0.05, "
        "dataset.name~cifar, created_at>=2026-11-01, data_digest=3f2a9c01 (the whole "
        "sha256:<hex> digest, or its first 8+ hex digits). Ops: = != < <= > >= ~ (contains).",
    )
    sort: str = Field(
        "-created",
        max_length=200,
        description="created, finished, a summary column, summary.<key> or a spec path "
        "(recipe.lr); - for descending. Nulls last, ties by id.",
    )

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str | None) -> str | None:
        if kind is not None and kind not in KINDS:
            raise ValueError(f"job kind {kind!r} is unknown; kinds are {', '.join(KINDS)}")
        return kind

    @field_validator("filter")
    @classmethod
    def _filters(cls, filters: list[str]) -> list[str]:
        for text in filters:
            search.parse_filter(text)
        return filters

    @field_validator("sort")
    @classmethod
    def _sort(cls, sort: str) -> str:
        search.parse_sort(sort)
        return sort

    def conditions(self) -> list[search.Condition]:
        """The filter expressions, parsed."""
        return [search.parse_filter(text) for text in self.filter]


class JobQuery(JobSearch):
    """The job list's filters, order and page."""

    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = Field(None, max_length=1000, description="`next_cursor` of a page.")


class JobExportQuery(JobSearch):
    """The job list as CSV: its filters and order, and the spec or summary paths to add."""

    columns: str | None = Field(
        None,
        max_length=2000,
        description="Comma-separated extra columns: spec.recipe.lr, summary.best_train_error.",
    )

    @field_validator("columns")
    @classmethod
    def _columns(cls, columns: str | None) -> str | None:
        names = [name.strip() for name in (columns or "").split(",") if name.strip()]
        if len(names) > MAX_EXTRA_COLUMNS:
            raise ValueError(f"at most {MAX_EXTRA_COLUMNS} extra columns")
        for name in names:
            search.parse_field(name)
        return ",".join(names) or None

    def fields(self) -> list[search.Field]:
        """The extra columns, parsed."""
        return [search.parse_field(name) for name in (self.columns or "").split(",") if name]


MAX_EXTRA_COLUMNS = 50


class JobEdit(BaseModel):
    """What may change of a job once made: its tags and its note (left out: unchanged)."""

    model_config = ConfigDict(extra="forbid")

    tags: list[Tag] = Field(default_factory=list, max_length=20)
    note: str | None = Field(None, max_length=10_000, description="Free text; null clears it.")

    @field_validator("note")
    @classmethod
    def _text(cls, note: str | None) -> str | None:
        if note is not None and "\x00" in note:  # Postgres text cannot hold it
            raise ValueError("a note cannot hold NUL characters")
        return note

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: list[str]) -> list[str]:
        if any("\x00" in tag for tag in tags):
            raise ValueError("a tag cannot hold NUL characters")
        return tags

    @model_validator(mode="after")
    def _something(self) -> JobEdit:
        if not self.model_fields_set:
            raise ValueError("nothing to change: give tags, note or both")
        return self


class SessionOut(BaseModel):
    """Whether the API asks for keys, and what the caller's key may do."""

    auth_enabled: bool
    scopes: list[str]


class KindOut(BaseModel):
    """A job kind the service runs."""

    kind: str
    description: str


class JobPage(BaseModel):
    """One page of jobs; pass `next_cursor` as `cursor` for the next (null: no more)."""

    items: list[JobItem]
    next_cursor: str | None


class Series(BaseModel):
    """One metric's points, in step order."""

    steps: list[int]
    values: list[float]


class MetricsOut(BaseModel):
    """A job's metric series by name, at most `max_points` points each."""

    series: dict[str, Series]


class CheckpointOut(BaseModel):
    """A checkpoint file of a job, with the sha256 it is verified against and where to
    download it (where the server keeps it stays there)."""

    id: int
    step: int
    epoch: int
    name: str = Field(examples=["step-440.pt"])
    download: str = Field(examples=["/api/v1/jobs/3f2a.../checkpoints/440/file"])
    sha256: str
    bytes: int
    is_best: bool
    metrics: dict[str, Any] | None
    created_at: datetime

    @classmethod
    def of(cls, row: Checkpoint) -> CheckpointOut:
        """The view of a checkpoint row."""
        return cls(
            id=row.id,
            step=row.step,
            epoch=row.epoch,
            name=PurePosixPath(row.path).name,
            download=f"{API_PREFIX}/jobs/{row.job_id}/checkpoints/{row.step}/file",
            sha256=row.sha256,
            bytes=row.bytes,
            is_best=row.is_best,
            metrics=row.metrics,
            created_at=row.created_at,
        )


class ArtifactOut(BaseModel):
    """A result file of a job (a predict job's predictions), with the sha256 it is checked
    against on download."""

    name: str = Field(examples=["predictions.csv"])
    bytes: int
    sha256: str


class ModelOut(BaseModel):
    """A network of the zoo, with its parameters and MACs per image (10 classes)."""

    name: str
    family: str
    stem: str
    depth: int
    block: str
    unit: str
    shortcut: str | None
    shortcut_variant: str | None
    params: int
    macs: int
    input_size: int


class OptionChoice(BaseModel):
    """One value of a zoo option, with a short label in the papers' terms."""

    value: str
    label: str


class ModelOptionOut(BaseModel):
    """An option of `models.build`: its values, its default, and the nets it applies to."""

    name: str
    kind: Literal["choice", "number", "boolean"]
    description: str
    default: bool | float | str | None = Field(
        description="The value without the option; null: it depends on the net, as described"
    )
    choices: list[OptionChoice] = Field(
        default_factory=list, description="The values of a choice; empty otherwise"
    )
    families: list[str] = Field(description="The families whose nets take the option")
    shortcut_variants: list[str] | None = Field(
        default=None, description="The shortcut variants the option goes with; null: any"
    )


class ModelOptionsOut(BaseModel):
    """The zoo's families, and the options `models.build` takes for their nets."""

    families: list[str]
    options: list[ModelOptionOut]


class DatasetOut(BaseModel):
    """A dataset name: readable here or not, where from, and what it needs otherwise."""

    name: str
    available: bool
    downloadable: bool
    location: str | None = Field(
        description="Where it was found, relative to the server's DATA_DIR; null: not on disk.",
        examples=["cifar-10-batches-py"],
    )
    needs: str = Field(
        description="What to provide if it is not here (DATA_DIR: the server's data folder).",
        examples=["put cifar-10-python.tar.gz (or its unpacked cifar-10-batches-py/) in DATA_DIR"],
    )


class UploadOut(BaseModel):
    """An unpacked upload: use `{"name": "imagefolder", "path": path}` as a job's dataset."""

    name: Literal["imagefolder"] = "imagefolder"
    path: str = Field(examples=["uploads/3f2a..."])
    files: int
    bytes: int


class UploadItem(UploadOut):
    """An upload: its id (its archive's sha256) for DELETE, its owner and when it came."""

    id: str = Field(examples=["3f2a..."])
    owner: uuid.UUID | None = Field(
        None, description="The API key that sent it (its id); null: sent with auth off."
    )
    created_at: datetime

    @classmethod
    def of(cls, row: Upload) -> UploadItem:
        return cls(
            id=row.sha256,
            path=uploads.path_of(row.sha256),
            files=row.files,
            bytes=row.bytes,
            owner=row.owner_key_id,
            created_at=row.created_at,
        )


class HealthOut(BaseModel):
    """The process answers."""

    status: Literal["ok"] = "ok"


class ReadyOut(BaseModel):
    """Each dependency and whether it answered in time."""

    status: Literal["ok", "unavailable"]
    checks: dict[str, str]


class KeyIn(BaseModel):
    """A new API key's name and scopes (admin implies every scope)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    scopes: list[Scope] = Field(min_length=1)


class KeyOut(BaseModel):
    """An API key without its secret."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    name: str
    prefix: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: ApiKey) -> KeyOut:
        """The view of a key row."""
        return cls.model_validate(row)


class KeyCreated(KeyOut):
    """A new key; `key` is shown this once and cannot be read again."""

    key: str = Field(examples=["rs_1a2b3c4d_..."])


class RegisterIn(BaseModel):
    """A succeeded train job's checkpoint to add as the next version of a model."""

    model_config = ConfigDict(extra="forbid")

    job: uuid.UUID
    checkpoint: Literal["best", "last"] = "best"


class AliasIn(BaseModel):
    """The version an alias should point at."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=2**31 - 1)


class ImportPreprocessingIn(BaseModel):
    """An import's preprocessing: the fields that differ from the net's default."""

    model_config = ConfigDict(extra="forbid")

    crop: int | tuple[int, int] | None = Field(
        None, description="The net's input: one size, or [height, width]."
    )
    resize: int | None = Field(
        None, ge=1, description="The shorter side before the centre crop (absent: default)."
    )
    interpolation: Literal["bilinear", "bicubic", "nearest"] | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None


class ImportIn(BaseModel):
    """The form fields of an import, beside the file: which net, its classes, how it reads."""

    model_config = ConfigDict(extra="forbid")

    architecture: str | None = Field(
        None, max_length=100, description="A zoo name: resnet18..152, resnet20..1202."
    )
    options: dict[str, Any] = Field(default_factory=dict, max_length=16)
    classes: list[Annotated[str, Field(max_length=200)]] | None = Field(
        None, min_length=1, max_length=100_000
    )
    preprocessing: ImportPreprocessingIn = Field(default_factory=ImportPreprocessingIn)
    format: Literal["auto", "torchvision", "akamaster", "safetensors"] = "auto"
    weights: str | None = Field(
        None, max_length=100, description="A torchvision weight enum (ALLOW_DOWNLOADS)."
    )


class ImportedOut(BaseModel):
    """What an imported version was made from, and how it was checked."""

    format: Literal["torchvision", "akamaster", "safetensors"]
    file_name: str
    source_sha256: str = Field(description="The sha256 of the file as sent.")
    architecture: str
    keys: int = Field(description="Tensors the file held.")
    checked_against: Literal["torchvision"] | None = Field(
        description="Whose net gave the same outputs with the same weights (null: none has it)."
    )
    max_abs_diff: float | None = Field(
        description="Max |ours - torchvision's| over a seeded batch (within 1e-4)."
    )


class LineageOut(BaseModel):
    """What a version's job was fine-tuned from: a job, and the version it was registered as."""

    job_id: uuid.UUID
    model: str | None
    version: int | None


class VersionOut(BaseModel):
    """A registered version: its job's checkpoint and what that job reached."""

    version: int
    job_id: uuid.UUID
    checkpoint: Literal["best", "last"]
    step: int
    sha256: str
    model: str | None = Field(description="The zoo name of the job's net, e.g. resnet20.")
    dataset: str | None
    test_error: float | None = Field(description="The job's best or final test error (0..1).")
    params: int | None
    owner: uuid.UUID | None = Field(
        None, description="The API key that made it (its id); null: made with auth off."
    )
    created_at: datetime
    imported: ImportedOut | None = Field(
        None, description="Imported weights: the file and its check (null: a trained job's)."
    )
    fine_tuned_from: LineageOut | None = Field(
        None, description="The job (and version) its job started from; null: not a fine-tune."
    )


class AliasOut(BaseModel):
    """A name for a version, e.g. production; moving it switches traffic."""

    alias: str
    version: int
    updated_at: datetime


class RegisteredModelOut(BaseModel):
    """A named model with its versions (oldest first) and aliases."""

    name: str
    owner: uuid.UUID | None = Field(
        None,
        description="The API key that registered its first version; only it (or an admin "
        "key) adds versions and moves aliases. Null: registered with auth off.",
    )
    created_at: datetime
    versions: list[VersionOut]
    aliases: list[AliasOut]


class RegistryQuery(BaseModel):
    """Query parameters of GET /registry: a page of models in name order."""

    model_config = ConfigDict(extra="forbid")

    q: str | None = Field(None, max_length=100, description="Text in the model's name.")
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = Field(None, max_length=1000, description="`next_cursor` of a page.")


class RegisteredModelPage(BaseModel):
    """One page of models; pass `next_cursor` as `cursor` for the next (null: no more)."""

    items: list[RegisteredModelOut]
    next_cursor: str | None


ExportFormat = Literal["onnx", "torchscript", "torch_export"]  # training.export.FORMATS


class ExportIn(BaseModel):
    """The deployment format to export a registered version to."""

    model_config = ConfigDict(extra="forbid")

    format: ExportFormat = Field(
        description="onnx (ONNX Runtime, opset 20), torchscript (torch.jit.load) or "
        "torch_export (torch.export.load, a .pt2)."
    )


class ExportOut(BaseModel):
    """A version's stored export: the served net (batch norms folded) with a softmax, from
    a normalised float32 batch (N, C, H, W), N free, to class probabilities."""

    model: str
    version: int
    format: ExportFormat
    sha256: str
    bytes: int
    max_abs_diff: float = Field(
        description="The check before it was kept: max |p_export - p_eager| over 8 seeded "
        "images, and over one (the batch axis is free)."
    )
    tolerance: float = Field(description="The bound the check held it to.")
    details: dict[str, Any] = Field(
        description="softmax, input (shape, mean, std), classes, batches checked, torch "
        "version; for ONNX the opset and ONNX Runtime version."
    )
    file: str = Field(description="Where to download it (streamed, sha256 in a header).")
    owner: uuid.UUID | None = Field(None, description="The API key that made it (its id).")
    created_at: datetime


class ClassScore(BaseModel):
    """One of an image's top-k classes."""

    label: str
    index: int
    probability: float


class ImageError(BaseModel):
    """Why one file of a request was not classified."""

    status: int = Field(examples=[415])
    message: str


class ImagePrediction(BaseModel):
    """One file's answer: its top-k classes, or the error that kept it out."""

    file: str
    resize: Literal["none", "resize", "resize+center-crop"] | None = Field(
        description="How the image was fitted to the input size (null for a failed file)."
    )
    top_k: list[ClassScore]
    error: ImageError | None = None


class ServedModel(BaseModel):
    """The checkpoint that answered: the reference as sent and what it resolved to."""

    ref: str
    name: str | None = Field(description="The registered model; null for a job id reference.")
    version: int | None
    job_id: uuid.UUID
    sha256: str
    step: int


class Preprocessing(BaseModel):
    """The checkpoint's declared preprocessing, applied to every image."""

    channels: int
    input_size: list[int] = Field(description="[height, width]: the centre crop, the net's input")
    resize: int | None = Field(
        description="The shorter side is resized to this before the crop; null: the whole "
        "image is resized to the input size"
    )
    interpolation: str
    mean: list[float]
    std: list[float]


class Timing(BaseModel):
    """Milliseconds in the model's queue and forward pass, and in the whole request."""

    queue_forward_ms: float
    total_ms: float


class PredictOut(BaseModel):
    """Per file, in request order: the top-k classes or an error; the model that answered."""

    model: ServedModel
    preprocessing: Preprocessing
    results: list[ImagePrediction]
    timing: Timing


class BatcherStats(BaseModel):
    """A loaded model's micro-batcher: how many forward passes of which sizes it ran."""

    sha256: str
    queued: int
    max_batch: int
    batches: int
    images: int
    batch_sizes: dict[int, int] = Field(description="Forward passes per batch size.")


class PredictStats(BaseModel):
    """The model cache: loads so far and each loaded model's batching."""

    loads: int
    models: list[BatcherStats]


class StudyIn(BaseModel):
    """A study: a preset on a dataset, or a base train spec with a grid; and its seeds."""

    model_config = ConfigDict(extra="forbid")

    preset: str | None = Field(None, max_length=64, description="GET /studies/presets.")
    dataset: dict[str, Any] | None = Field(
        None, description="With a preset: the dataset spec, e.g. {'name': 'fashion_mnist'}."
    )
    scale: Literal["quick", "paper"] = Field(
        "quick", description="With a preset: quick (CPU, minutes) or paper (the papers' recipe)."
    )
    base: dict[str, Any] | None = Field(
        None, description="Without a preset: a train spec (model, dataset, recipe)."
    )
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Axis (model.name, options.unit, recipe.lr, dataset.train_limit, ...) -> "
        "values; the cells are their product.",
        examples=[{"model.name": ["plain20", "resnet20"], "recipe.lr": [0.1, 0.05]}],
    )
    seeds: int | list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(
        1, description="A number of seeds (0..N-1) or the seeds themselves."
    )
    name: str | None = Field(None, max_length=200)
    tags: list[str] = Field(default_factory=list, max_length=20)
    max_parallel: int = Field(2, ge=1, le=1000, description="Jobs of the study run at once.")

    @field_validator("seeds")
    @classmethod
    def _some_seeds(cls, seeds: int | list[int]) -> int | list[int]:
        if isinstance(seeds, int) and not 1 <= seeds <= 1000:
            raise ValueError("seeds must be from 1 to 1000, or a list of seeds")
        if isinstance(seeds, list) and (not seeds or len(set(seeds)) != len(seeds)):
            raise ValueError("a list of seeds must be non-empty and without repeats")
        return seeds

    @model_validator(mode="after")
    def _preset_or_base(self) -> StudyIn:
        if (self.preset is None) == (self.base is None):
            raise ValueError("give either a preset (with a dataset) or a base spec with a grid")
        if self.preset is not None and (self.dataset is None or self.grid):
            raise ValueError("a preset takes a dataset and makes its own grid")
        if self.base is not None and self.dataset is not None:
            raise ValueError("without a preset, the dataset goes into base")
        return self

    def seed_list(self) -> list[int]:
        """The seeds as a list."""
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)


class StudyCounts(BaseModel):
    """How many of a study's jobs are in each status, and how many have ended."""

    queued: int
    running: int
    succeeded: int
    failed: int
    cancelled: int
    done: int
    total: int


class ErrorStats(BaseModel):
    """One error over a cell's finished seeds (fractions)."""

    median: float | None
    mean: float | None
    std: float | None = Field(description="Sample standard deviation; null under 2 seeds.")
    min: float | None
    max: float | None


class CellResult(BaseModel):
    """A cell of the grid: its values, its seeds, its errors, and the papers' number."""

    cell: int
    values: dict[str, Any]
    jobs: int
    seeds_done: list[int]
    failed: int
    cancelled: int
    final_train_error: ErrorStats
    final_test_error: ErrorStats
    best_test_error: ErrorStats
    params: int | None
    macs: int | None
    paper: float | None = Field(description="The papers' number for the cell (a fraction).")
    difference: float | None = Field(description="Our median of `metric` minus the papers'.")
    data_digests: list[str] = Field(
        default_factory=list, description="The digests of the data its jobs read."
    )
    environments: list[str] = Field(
        default_factory=list, description="What its jobs ran on (software and device), each."
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="Where its jobs ran on different data or environments.",
    )


class StudyItem(BaseModel):
    """A study as the studies list shows it."""

    id: uuid.UUID
    name: str | None
    tags: list[str]
    preset: str | None
    scale: str | None
    state: str
    counts: StudyCounts
    max_parallel: int
    owner: uuid.UUID | None = Field(
        None, description="The API key that made it (its id); null: made with auth off."
    )
    created_at: datetime


class StudyOut(StudyItem):
    """A study with its spec, the papers' source, and its results per cell."""

    spec: dict[str, Any]
    metric: str = Field(description="The aggregate the papers' numbers compare with.")
    source: str | None
    note: str | None
    cells: list[CellResult]
    jobs: list[JobItem]


class StudyPreview(BaseModel):
    """What a study request would make (`dry_run`): its base, grid, cells and job count."""

    name: str | None
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int]
    cells: list[dict[str, Any]] = Field(description="Each cell's values and papers' number.")
    jobs: int


class StudyPresetOut(BaseModel):
    """A preset: one of the papers' experiments, at a quick and at the papers' scale."""

    name: str
    title: str
    source: str
    description: str
    metric: str
    note: str
    quick_datasets: list[str]
    recipe: dict[str, str] = Field(description="Each scale's recipe in words.")


class CellCurve(BaseModel):
    """A cell's curve over seeds: the centre and a band at each step."""

    cell: int
    values: dict[str, Any]
    steps: list[int]
    center: list[float | None]
    lower: list[float | None]
    upper: list[float | None]
    seeds: list[int]


class StudyCurvesOut(BaseModel):
    """A metric's curves of every cell of a study."""

    metric: str
    center: Literal["median", "mean"]
    band: Literal["minmax", "std"]
    cells: list[CellCurve]


class WorkerOut(BaseModel):
    """A worker process group as registered, and whether its heartbeat is recent."""

    name: str = Field(examples=["worker-gpu0@host"])
    host: str
    pid: int
    devices: list[str] = Field(examples=[["cuda:0"]], description="cpu, or the GPUs it owns.")
    queues: list[str] = Field(examples=[["train", "gpu"]], description="The queues it serves.")
    state: Literal["alive", "lost"] = Field(
        description="lost: no heartbeat for three leases (its jobs are re-enqueued)."
    )
    current_job: uuid.UUID | None
    jobs_done: int = Field(description="Jobs that ended on it since it started.")
    started_at: datetime
    last_seen_at: datetime

    @classmethod
    def of(cls, seen: workers.Seen) -> WorkerOut:
        """The view of a registered worker."""
        row = seen.worker
        return cls(
            name=row.name,
            host=row.host,
            pid=row.pid,
            devices=row.devices,
            queues=row.queues,
            state=seen.state,
            current_job=row.current_job_id,
            jobs_done=row.jobs_done,
            started_at=row.started_at,
            last_seen_at=row.last_seen_at,
        )


class UsageOut(BaseModel):
    """The bytes an owner's artifacts take as stored, against MAX_ARTIFACT_BYTES_PER_OWNER."""

    owner: uuid.UUID | None = Field(
        None, description="The API key (its id); null: rows made with auth off."
    )
    name: str | None = Field(None, description="The key's name.")
    job_bytes: int = Field(description="Its jobs' files: checkpoints, result files, records.")
    export_bytes: int = Field(description="The exports it made.")
    bytes: int = Field(description="job_bytes + export_bytes.")
    jobs: int = Field(description="Its jobs that keep stored files.")
    limit_bytes: int = Field(description="MAX_ARTIFACT_BYTES_PER_OWNER; 0: unlimited.")
    left_bytes: int | None = Field(description="What it may still add; null: unlimited.")
