"""What the API answers: pydantic models built from ORM rows, never the rows themselves."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from client.filters import JobFilter
from client.wire import API_PREFIX as API_PREFIX
from client.wire import ExportFormat as ExportFormat
from client.wire import JobStatus, Scope
from core import job_queries, job_search, resources, uploads, workers
from core.db.tables import ApiKey, Checkpoint, Event, Job, Upload
from core.kinds import KINDS, shown
from core.studies.search import Method as SearchMethod
from core.studies.search import PrunerName
from training.quantize import DEFAULT_BOUND_PP, DEFAULT_CALIBRATION, MAX_CALIBRATION
from training.specs import Tag


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
        return cls.model_validate(job_queries.links(job_id))


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
        resources.CPU_QUEUE, description="The queue of what it needs: cpu, gpu, gpu-N."
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
        return cls.model_validate(job_queries.fields(job))


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
        fields = job_queries.fields(job)
        # Server file paths (a pinned checkpoint's) stay on the server.
        spec, summary = shown(job.kind, "spec", job.spec), shown(job.kind, "summary", job.summary)
        fields.update(spec=spec, summary=summary, updated_at=job.updated_at)
        fields.update(data=job.data, environment=job.environment)
        return cls.model_validate(fields)


class RetryOut(BaseModel):
    """A failed, cancelled or pruned job queued again, and where its next run starts."""

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
        return cls.model_validate(job_queries.state(job))


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


class JobSearch(JobFilter):
    """The job list's filters and order (`client.filters` declares them), checked here:
    a registered kind, filters and a sort that `core.job_search` reads."""

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
            job_search.parse_filter(text)
        return filters

    @field_validator("sort")
    @classmethod
    def _sort(cls, sort: str) -> str:
        job_search.parse_sort(sort)
        return sort


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
            job_search.parse_field(name)
        return ",".join(names) or None

    def fields(self) -> list[job_search.Field]:
        """The extra columns, parsed."""
        return [job_search.parse_field(name) for name in (self.columns or "").split(",") if name]


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


class ShadowIn(BaseModel):
    """A version that takes a copy of a share of an alias's traffic, answers compared only."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=2**31 - 1)
    percent: int = Field(100, description="The share of the alias's requests copied, 1 to 100.")


class AliasIn(BaseModel):
    """An alias's whole state: one version, or weights per version; sticky; a shadow.

    What is not sent is reset (not sticky, no shadow)."""

    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(None, ge=1, le=2**31 - 1)
    weights: dict[int, int] | None = Field(
        None,
        description="Version -> weight (an integer > 0): each version's share of the traffic, "
        'e.g. {"3": 90, "4": 10}; at most 10 versions.',
    )
    sticky: bool = Field(False, description="A caller (its API key, else X-Session-Key) keeps "
                         "its version while the weights hold.")  # fmt: skip
    shadow: ShadowIn | None = None


class PromoteIn(BaseModel):
    """The version an alias should serve alone from now on."""

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


class ShadowOut(BaseModel):
    """The version an alias copies `percent` of its requests to."""

    version: int
    percent: int


class AliasOut(BaseModel):
    """A name for a version, e.g. production; moving it switches traffic."""

    alias: str
    version: int = Field(description="The primary: the version of greatest weight.")
    updated_at: datetime
    weights: dict[str, int] = Field(description="Version -> weight; one version: weight 100.")
    sticky: bool
    shadow: ShadowOut | None


class ShadowComparisonOut(BaseModel):
    """A shadow version's answers against a primary's, since this API process started."""

    version: int = Field(description="The version that answered the requests.")
    shadow: int = Field(description="The shadow version that answered their copies.")
    images: int
    agreement: float | None = Field(description="The share of images of the same top-1 class.")
    mean_abs_diff: float | None = Field(
        description="Mean over images and classes of |p shadow - p primary|."
    )
    mean_latency_ms: float | None = Field(description="A copy's mean forward latency.")
    dropped: int = Field(description="Copies shed (the shadow or the primary busy) or unfit.")
    failed: int


class HistoryOut(BaseModel):
    """One registry change: what, who (the key's id and name), when, before -> after."""

    action: str = Field(description="e.g. version.registered, alias.weights, alias.promoted")
    alias: str | None
    version: int | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    key_id: uuid.UUID | None
    key_name: str | None
    at: datetime


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


class ExportIn(BaseModel):
    """The deployment format to export a registered version to; for onnx_int8, how it is
    calibrated and the bound its evaluation error is held to."""

    model_config = ConfigDict(extra="forbid")

    format: ExportFormat = Field(
        description="onnx (ONNX Runtime, opset 20), torchscript (torch.jit.load), "
        "torch_export (torch.export.load, a .pt2) or onnx_int8 (ONNX Runtime's static "
        "int8 quantization of the onnx graph, calibrated on the run's training images)."
    )
    calibration_images: int | None = Field(
        None,
        ge=1,
        le=MAX_CALIBRATION,
        description=f"onnx_int8: training images whose activations calibrate the int8 "
        f"ranges (default {DEFAULT_CALIBRATION}; at most the training split).",
    )
    max_error_increase_pp: float | None = Field(
        None,
        ge=0,
        le=100,
        description=f"onnx_int8: how many percentage points of evaluation error the int8 "
        f"graph may add to the float graph's (default {DEFAULT_BOUND_PP:g}); over it, 422 "
        "with both errors and nothing kept.",
    )
    eval_limit: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="onnx_int8: evaluate both graphs on at most this many images of the "
        "evaluation split (a seeded sample); default the whole split.",
    )

    @model_validator(mode="after")
    def _int8_only(self) -> ExportIn:
        given = [
            name
            for name in ("calibration_images", "max_error_increase_pp", "eval_limit")
            if getattr(self, name) is not None
        ]
        if given and self.format != "onnx_int8":
            raise ValueError(f"{', '.join(given)} apply to the onnx_int8 format only")
        return self


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
        "images, and over one (the batch axis is free); for onnx_int8 the percentage "
        "points of evaluation error it adds to the float graph's (0 when none)."
    )
    tolerance: float = Field(
        description="The bound the check held it to (onnx_int8: percentage points)."
    )
    details: dict[str, Any] = Field(
        description="softmax, input (shape, mean, std), classes, batches checked, torch "
        "version; for ONNX the opset and ONNX Runtime version; for onnx_int8 both errors "
        "(float_error, int8_error) and the images they are over (eval_images, eval_split), "
        "calibration_images, and both graphs' images/s at batch 64 here with their speedup."
    )
    file: str = Field(description="Where to download it (streamed, sha256 in a header).")
    owner: uuid.UUID | None = Field(None, description="The API key that made it (its id).")
    created_at: datetime


class PayloadQuery(BaseModel):
    """Query parameters of a payload log's list: a page of segments, newest first."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(50, ge=1, le=500)
    cursor: str | None = Field(None, max_length=200, description="`next_cursor` of a page.")


class PayloadSegmentOut(BaseModel):
    """One stored segment of a payload log: gzip'd JSON Lines, a record per sampled image."""

    name: str
    records: int
    bytes: int
    first_at: datetime = Field(description="When its first record's image was answered.")
    last_at: datetime
    sha256: str
    file: str = Field(description="Where to download it (streamed, sha256 in a header).")


class PayloadPage(BaseModel):
    """One page of segments, newest first; pass `next_cursor` as `cursor` for the next."""

    items: list[PayloadSegmentOut]
    next_cursor: str | None


class DriftWindow(BaseModel):
    """The served images the statistics look back on (this API process's)."""

    images: int
    max_images: int
    max_seconds: float
    first_at: datetime | None
    last_at: datetime | None


class DriftReference(BaseModel):
    """The training data the served images are held against, as the checkpoint records it."""

    mean: list[float] = Field(description="Per channel, of the training split, on 0..1.")
    std: list[float]
    classes: list[str]
    class_distribution: list[float]
    class_source: Literal["uniform", "training_split"] = Field(
        description="training_split: the training split's class shares; uniform: the "
        "checkpoint records no class counts of its training split."
    )


class ChannelDrift(BaseModel):
    """One channel's pixels served (0..1) against the training split's."""

    channel: int
    mean: float
    std: float
    shift: float = Field(description="|mean served - mean train| / std train.")
    std_ratio: float = Field(description="std served / std train.")


class ClassDrift(BaseModel):
    """The predicted classes' distribution against the reference's."""

    counts: list[int]
    total_variation: float = Field(description="Half the L1 distance, 0..1.")
    jensen_shannon: float = Field(description="Jensen-Shannon distance (base 2), 0..1.")
    p_value: float | None = Field(
        description="Chi-square goodness-of-fit p-value of the counts (null: one class)."
    )


class DriftOut(BaseModel):
    """A served model's drift: its window's statistics against its training data."""

    model: str | None
    version: int | None
    job_id: uuid.UUID | None
    window: DriftWindow
    reference: DriftReference | None = Field(
        description="Null until this API process has served the model."
    )
    channels: list[ChannelDrift]
    classes: ClassDrift | None


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


class ExplainedImage(BaseModel):
    """One file's Grad-CAM: the class explained, and the heatmap (0..1) at the explained
    layer's resolution and upsampled to the net's input."""

    file: str
    resize: Literal["none", "resize", "resize+center-crop"]
    explained: ClassScore = Field(description="The class explained and its probability.")
    heatmap: list[list[float]] = Field(description="[h][w] at the layer's resolution, 0..1.")
    upsampled: list[list[float]] = Field(
        description="[H][W] at the net's input size (bilinear), 0..1."
    )


class ExplainTiming(BaseModel):
    """Milliseconds of the explain process's Grad-CAM, and of the whole request."""

    explain_ms: float
    total_ms: float


class ExplainOut(BaseModel):
    """Per file, in request order: its Grad-CAM on the net's last residual stage."""

    model: ServedModel
    preprocessing: Preprocessing
    layer: str = Field(description="The layer explained: the net's last residual stage.")
    results: list[ExplainedImage]
    timing: ExplainTiming


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
    search: Literal["grid"] | SearchMethod = Field(
        "grid",
        description="grid: every cell of the grid; random or tpe (Bayesian, Optuna's TPE): "
        "`trials` samples of `space`, each one train job of the base with its values set.",
    )
    space: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="A search's parameters: spec path -> {type: choice, values: [...]}, "
        "{type: uniform | loguniform, low, high} or {type: int, low, high, step, log}.",
        examples=[
            {
                "recipe.lr": {"type": "loguniform", "low": 0.01, "high": 0.5},
                "recipe.weight_decay": {"type": "loguniform", "low": 1e-5, "high": 1e-3},
            }
        ],
    )
    trials: int | None = Field(None, ge=1, le=10_000, description="A search's trial budget.")
    pruner: PrunerName = Field(
        "none",
        description="A search's early stopping (Optuna's pruners), judged on `objective` at "
        "each of a trial's evaluations; a pruned trial's job ends `pruned`.",
    )
    objective: str = Field(
        "val/error", max_length=32, description="The metric a search minimises (last point)."
    )
    search_seed: int = Field(0, ge=0, le=2**31 - 1, description="Seeds a search's sampler.")

    @model_validator(mode="after")
    def _search_or_grid(self) -> StudyIn:
        if self.search == "grid":
            if self.space or self.trials is not None or self.pruner != "none":
                raise ValueError(
                    "space, trials and pruner belong to a search: set search to random or tpe"
                )
            return self
        if self.preset is not None:
            raise ValueError("a search takes a base spec and a space, not a preset")
        if not self.space or self.trials is None:
            raise ValueError(f"a {self.search} search needs a space and a number of trials")
        return self

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


class StudyExtendIn(BaseModel):
    """More of a study: seeds for every cell (a number) or chosen cells ({cell: seeds}), or
    trials for a search. The new jobs join the same results. A study's plan proposes one
    (`StudyPlanOut.extend`), sent back as it comes."""

    model_config = ConfigDict(extra="forbid")

    add_seeds: int | dict[str, Annotated[int, Field(ge=0, le=1000)]] | None = Field(
        None,
        description="Seeds to add to every cell, or per cell index; each cell's new seeds are "
        "the smallest it has not run. GET /studies/{id}/plan proposes them.",
        examples=[3, {"0": 2, "3": 4}],
    )
    add_trials: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Trials for a search.",
        exclude_if=lambda value: value is None,  # a plan's proposal adds seeds only
    )

    @field_validator("add_seeds")
    @classmethod
    def _cells_by_index(cls, value: int | dict[str, int] | None) -> int | dict[str, int] | None:
        if isinstance(value, int) and not 1 <= value <= 1000:
            raise ValueError("add_seeds must be from 1 to 1000 seeds, or {cell: seeds}")
        if isinstance(value, dict) and not all(key.isdigit() for key in value):
            raise ValueError("add_seeds' keys are cell indexes (0, 1, ...) as in the study's cells")
        return value

    def seeds_by_cell(self) -> int | dict[int, int] | None:
        """add_seeds with its cells as numbers."""
        if isinstance(self.add_seeds, dict):
            return {int(key): count for key, count in self.add_seeds.items()}
        return self.add_seeds


class StudyCounts(BaseModel):
    """How many of a study's jobs are in each status, and how many have ended."""

    queued: int
    running: int
    succeeded: int
    failed: int
    cancelled: int
    pruned: int = Field(description="A search's trials its pruner stopped early.")
    done: int
    total: int


class ErrorStats(BaseModel):
    """One error over a cell's finished seeds (fractions)."""

    median: float | None
    mean: float | None
    std: float | None = Field(description="Sample standard deviation; null under 2 seeds.")
    min: float | None
    max: float | None
    median_ci: list[float] | None = Field(
        None, description="The median's 95% bootstrap interval [low, high]; null under 2 seeds."
    )
    mean_ci: list[float] | None = Field(
        None, description="The mean's 95% bootstrap interval [low, high]; null under 2 seeds."
    )


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


# What a study's seeds say with confidence: the papers' claims, comparisons, the planner.


class ClaimResult(BaseModel):
    """A claimed ordering of two cells on a metric, judged on their seeds."""

    claim: str = Field(description="The ordering in words, e.g. 'plain56 > plain44 in ...'.")
    verdict: Literal["reproduced", "contradicted", "inconclusive"]
    metric: str
    relation: Literal["<", ">"] = Field(description="Cell a below (<) or above (>) cell b.")
    a: int = Field(description="Cell a's index.")
    b: int = Field(description="Cell b's index.")
    p: float | None = Field(
        description="One-sided p in the claimed direction, Holm-adjusted across the claims."
    )
    p_opposite: float | None = Field(description="The same for the reverse ordering.")
    test: str
    p_other: float | None = Field(description="`p` by the other test (`other_test`).")
    other_test: str
    effect: float | None = Field(description="Effect size; positive: cell a higher.")
    effect_name: str
    difference: float | None = Field(description="Mean of a minus mean of b.")
    n: list[int] = Field(description="Finished seeds of cell a and cell b.")
    seeds_needed: int | None = Field(
        description="An inconclusive claim's seeds per cell that would settle it; null if none."
    )
    advice: str | None


class CellComparison(BaseModel):
    """Two cells compared on a metric: two-sided p (Holm-adjusted), effect, the lower one."""

    a: int
    b: int
    a_label: str
    b_label: str
    n: list[int]
    difference: float | None = Field(description="Mean of a minus mean of b.")
    p: float | None = Field(description="Two-sided, Holm-adjusted across the comparisons.")
    p_raw: float | None
    p_less: float | None = Field(description="One-sided (a < b), unadjusted.")
    p_greater: float | None = Field(description="One-sided (a > b), unadjusted.")
    effect: float | None
    effect_name: str
    lower: int | None = Field(description="The cell lower at `level`; null: neither.")


class StudyComparisonsOut(BaseModel):
    """`GET /studies/{id}/compare`: cells compared on one metric by one test."""

    metric: str
    test: str
    level: float
    reference: int | None
    comparisons: list[CellComparison]


class StudyPlanOut(BaseModel):
    """`GET /studies/{id}/plan`: each claim's verdict and seeds needed, and the body that
    adds them (`POST /studies/{id}/extend`)."""

    level: float
    power: float
    test: str
    claims: list[ClaimResult]
    extend: StudyExtendIn


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
    claims: list[ClaimResult] = Field(
        default_factory=list, description="The preset's claims judged on the seeds."
    )


class PreviewCell(BaseModel):
    """A cell a study would make: its values of the grid's axes, and the papers' number."""

    values: dict[str, Any]
    paper: float | None = Field(description="The papers' number for the cell (a fraction).")


class StudyPreview(BaseModel):
    """What a study request would make (`dry_run`): its base, grid, cells and job count."""

    name: str | None
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int]
    cells: list[PreviewCell]
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


# A search study's trials (`GET /studies/{id}/trials`).


class TrialOut(BaseModel):
    """One trial of a search: its job, its parameters, its objective and what it cost."""

    trial: int = Field(description="Optuna's trial number.")
    cell: int = Field(description="Its index in the study's cells (its job's `cell`).")
    job_id: uuid.UUID | None
    status: str = Field(description="Its job's status: queued ... succeeded, or pruned.")
    params: dict[str, Any] = Field(description="Each space path's value in this trial.")
    value: float | None = Field(description="The objective's last point (pruned trials too).")
    best_value: float | None = Field(description="The objective's best point.")
    steps: int = Field(description="Steps trained.")
    job_seconds: float = Field(description="Seconds its job held a worker.")
    pruned_at: int | None = Field(description="A pruned trial's step where it was stopped.")


class BestTrialOut(BaseModel):
    """The completed trial with the best objective, and the full spec its job trained."""

    trial: int
    job_id: uuid.UUID | None
    params: dict[str, Any]
    value: float
    spec: dict[str, Any] = Field(description="The job's spec: train it again with POST /jobs.")


class BestSoFarPoint(BaseModel):
    """A completed trial's objective and the best objective up to it."""

    trial: int
    value: float
    best: float


class ParallelAxis(BaseModel):
    """A parameter's axis of the parallel coordinates: its range, or its choices."""

    path: str
    type: str
    low: float | None
    high: float | None
    log: bool
    choices: list[Any] | None


class ParallelLine(BaseModel):
    """A completed (or pruned: its last evaluation) trial through its parameters to its
    objective."""

    trial: int
    params: dict[str, Any]
    value: float
    status: str = Field(description="succeeded, or pruned.")


class ParallelOut(BaseModel):
    """The parallel coordinates of a search: an axis per parameter, a line per trial."""

    objective: str
    axes: list[ParallelAxis]
    lines: list[ParallelLine]


class JobSecondsOut(BaseModel):
    """The compute a search took, in all and by its trials' status."""

    total: float
    by_status: dict[str, float]
    saved_by_pruning: float = Field(
        description="An estimate: each pruned trial's seconds per step times its steps left."
    )


class StudyTrialsOut(BaseModel):
    """A search's trials, its best trial, the best so far, importances and compute."""

    method: str
    objective: str
    direction: Literal["minimize", "maximize"]
    trials: list[TrialOut]
    best: BestTrialOut | None
    best_so_far: list[BestSoFarPoint]
    importances: dict[str, float] | None = Field(
        description="Each parameter's fANOVA importance (they sum to 1); null under 2 "
        "completed trials, with one parameter, or where the trials do not vary."
    )
    parallel: ParallelOut
    job_seconds: JobSecondsOut


class WorkerOut(BaseModel):
    """A worker process group as registered, and whether its heartbeat is recent."""

    name: str = Field(examples=["worker-gpu0@host"])
    host: str
    pid: int
    devices: list[str] = Field(examples=[["cuda:0"]], description="cpu, or the GPUs it owns.")
    queues: list[str] = Field(examples=[["cpu", "gpu"]], description="The queues it serves.")
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
