"""What the service answers, as typed dictionaries (the JSON as it comes, keys checked by
mypy), and the few values the client makes itself (points, events) as small dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict


class ErrorDetail(TypedDict):
    loc: list[str | int]
    msg: str


class JobProgress(TypedDict):
    step: int
    total_steps: int | None


class JobResults(TypedDict):
    final_test_error: float | None
    best_test_error: float | None
    params: int | None
    macs: int | None
    wall_time_s: float | None
    images_per_s: float | None


class JobItem(TypedDict):
    """A job as lists show it."""

    id: str
    kind: str
    status: str
    name: str | None
    tags: list[str]
    note: NotRequired[str | None]
    model: str | None
    family: str | None
    depth: int | None
    dataset: str | None
    data_digest: NotRequired[str | None]  # of the data it read, once its worker loaded it
    source_job: str | None
    study: NotRequired[str | None]
    cell: NotRequired[int | None]
    held: NotRequired[bool]
    queue: NotRequired[str]
    waiting_for: NotRequired[str | None]
    owner: NotRequired[str | None]
    attempt: int
    max_attempts: int
    worker: str | None
    device: str | None
    error: str | None
    cancel_requested: bool
    progress: JobProgress
    results: JobResults
    created_at: str
    started_at: str | None
    finished_at: str | None
    links: dict[str, str]


class Job(JobItem):
    """A job read on its own: also its whole spec and summary."""

    spec: dict[str, Any]
    summary: dict[str, Any] | None
    data: NotRequired[dict[str, Any] | None]  # digest, source, classes, splits, skipped files
    environment: NotRequired[dict[str, Any] | None]  # versions and device it ran on
    updated_at: str


class JobPage(TypedDict):
    items: list[JobItem]
    next_cursor: str | None


class Retried(TypedDict):
    job: Job
    resume_step: int | None
    message: str


class Kind(TypedDict):
    kind: str
    description: str


class Checkpoint(TypedDict):
    id: int
    step: int
    epoch: int
    name: str
    download: str
    sha256: str
    bytes: int
    is_best: bool
    metrics: dict[str, Any] | None
    created_at: str


class Artifact(TypedDict):
    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Point:
    """One value of a metric at a step."""

    step: int
    value: float


@dataclass(frozen=True)
class MetricPoint:
    """One value of the metric `name` at a step, as a live stream delivers it."""

    name: str
    step: int
    value: float


@dataclass(frozen=True)
class Event:
    """One event of a job's stream: `log`, `metrics`, `progress`, `status` or `end`."""

    name: str
    data: dict[str, Any]
    id: str | None = None


class StudyCounts(TypedDict):
    queued: int
    running: int
    succeeded: int
    failed: int
    cancelled: int
    done: int
    total: int


class ErrorStats(TypedDict):
    """An error over a cell's seeds, as fractions (None before any seed finished)."""

    median: float | None
    mean: float | None
    std: float | None
    min: float | None
    max: float | None


class CellResult(TypedDict):
    """One row of a study's results table: a cell of the grid over its seeds."""

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
    paper: float | None
    difference: float | None
    data_digests: NotRequired[list[str]]  # of the data its jobs read
    environments: NotRequired[list[str]]  # what its jobs ran on, one line each
    warnings: NotRequired[list[str]]  # where its jobs ran on different data or environments


class StudyItem(TypedDict):
    id: str
    name: str | None
    tags: list[str]
    preset: str | None
    scale: str | None
    state: str
    counts: StudyCounts
    max_parallel: int
    owner: NotRequired[str | None]
    created_at: str


class Study(StudyItem):
    """A study with its spec, its results per cell and its jobs."""

    spec: dict[str, Any]
    metric: str
    source: str | None
    note: str | None
    cells: list[CellResult]
    jobs: list[JobItem]


class PreviewCell(TypedDict):
    values: dict[str, Any]
    paper: float | None


class StudyPreview(TypedDict):
    """What a study would make (a dry run): its cells and its job count."""

    name: str | None
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int]
    cells: list[PreviewCell]
    jobs: int


class Preset(TypedDict):
    name: str
    title: str
    source: str
    description: str
    metric: str
    note: str
    quick_datasets: list[str]
    recipe: dict[str, str]


class Imported(TypedDict):
    """What an imported version was made from, and how it was checked."""

    format: str  # torchvision | akamaster | safetensors
    file_name: str
    source_sha256: str
    architecture: str
    keys: int
    checked_against: str | None  # torchvision, or null
    max_abs_diff: float | None


class Version(TypedDict):
    version: int
    job_id: str
    checkpoint: str
    step: int
    sha256: str
    model: str | None
    dataset: str | None
    test_error: float | None
    params: int | None
    owner: NotRequired[str | None]
    created_at: str
    imported: NotRequired[Imported | None]  # imported weights: the file and its check
    fine_tuned_from: NotRequired[Lineage | None]  # the job (and version) it started from


class Lineage(TypedDict):
    job_id: str
    model: str | None
    version: int | None


class Export(TypedDict):
    """A version's stored export: the served net with a softmax (normalised float32 batch
    in, class probabilities out), and how close it came to the eager net."""

    model: str
    version: int
    format: str  # onnx | torchscript | torch_export
    sha256: str
    bytes: int
    max_abs_diff: float
    tolerance: float
    details: dict[str, Any]
    file: str
    owner: NotRequired[str | None]
    created_at: str


class Alias(TypedDict):
    alias: str
    version: int
    updated_at: str


class RegisteredModel(TypedDict):
    name: str
    owner: NotRequired[str | None]
    created_at: str
    versions: list[Version]
    aliases: list[Alias]


class RegistryPage(TypedDict):
    items: list[RegisteredModel]
    next_cursor: str | None


class ServedModel(TypedDict):
    ref: str
    name: str | None
    version: int | None
    job_id: str
    sha256: str
    step: int


class ClassScore(TypedDict):
    label: str
    index: int
    probability: float


class ImageError(TypedDict):
    status: int
    message: str


class ImagePrediction(TypedDict):
    file: str
    resize: str | None
    top_k: list[ClassScore]
    error: ImageError | None


class Preprocessing(TypedDict):
    channels: int
    input_size: list[int]
    mean: list[float]
    std: list[float]


class Timing(TypedDict):
    queue_forward_ms: float
    total_ms: float


class Prediction(TypedDict):
    model: ServedModel
    preprocessing: Preprocessing
    results: list[ImagePrediction]
    timing: Timing


class Health(TypedDict):
    status: str


class Ready(TypedDict):
    status: str
    checks: dict[str, str]


class Session(TypedDict):
    auth_enabled: bool
    scopes: list[str]
