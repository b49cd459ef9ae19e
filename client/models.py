"""What the service answers, as typed dictionaries (the JSON as it comes, keys checked by
mypy), and the few values the client makes itself (points, events) as small dataclasses.

Each typed dictionary is the service's OpenAPI schema of that answer, key for key: a key
the service may leave out is `NotRequired`; `tests/client/test_contract.py` fails where
the two differ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

from client.wire import ExportFormat, JobStatus


class ErrorDetail(TypedDict):
    loc: list[str | int]
    msg: str


class ErrorBody(TypedDict):
    code: str
    message: str
    details: NotRequired[list[ErrorDetail]]


class ErrorOut(TypedDict):
    """The shape of every error answer."""

    error: ErrorBody


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


class JobLinks(TypedDict):
    self: str
    metrics: str
    events: str
    checkpoints: str
    cancel: str


class JobItem(TypedDict):
    """A job as lists show it."""

    id: str
    kind: str
    status: JobStatus
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
    links: JobLinks


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


class Series(TypedDict):
    steps: list[int]
    values: list[float]


class Metrics(TypedDict):
    """A job's series by metric name."""

    series: dict[str, Series]


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
    pruned: int
    done: int
    total: int


class ErrorStats(TypedDict):
    """An error over a cell's seeds, as fractions (None before any seed finished)."""

    median: float | None
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    median_ci: NotRequired[list[float] | None]  # 95% bootstrap interval [low, high]
    mean_ci: NotRequired[list[float] | None]


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
    claims: NotRequired[list[ClaimResult]]  # the preset's claims judged on the seeds


class ClaimResult(TypedDict):
    """A claimed ordering of two cells on a metric, judged on their seeds."""

    claim: str
    verdict: Literal["reproduced", "contradicted", "inconclusive"]
    metric: str
    relation: Literal["<", ">"]
    a: int
    b: int
    p: float | None  # one-sided, claimed direction, Holm-adjusted across the claims
    p_opposite: float | None
    test: str
    p_other: float | None
    other_test: str
    effect: float | None
    effect_name: str
    difference: float | None
    n: list[int]
    seeds_needed: int | None
    advice: str | None


class CellComparison(TypedDict):
    a: int
    b: int
    a_label: str
    b_label: str
    n: list[int]
    difference: float | None
    p: float | None  # two-sided, Holm-adjusted across the comparisons
    p_raw: float | None
    p_less: float | None
    p_greater: float | None
    effect: float | None
    effect_name: str
    lower: int | None


class StudyComparisons(TypedDict):
    """Cells of a study compared on one metric by one test."""

    metric: str
    test: str
    level: float
    reference: int | None
    comparisons: list[CellComparison]


class StudyExtend(TypedDict):
    """More of a study, as `extend_study` sends it: seeds for every cell (a number) or
    chosen cells ({cell: seeds}), or trials for a search; a plan proposes one."""

    add_seeds: NotRequired[int | dict[str, int] | None]
    add_trials: NotRequired[int | None]


class StudyPlan(TypedDict):
    """Each claim's verdict and seeds needed, and the body that adds those seeds."""

    level: float
    power: float
    test: str
    claims: list[ClaimResult]
    extend: StudyExtend  # the body that adds the seeds the open claims need


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


# A search study's trials (`Client.study_trials`).


class Trial(TypedDict):
    """One trial of a search: its job, parameters, objective (last and best point), cost."""

    trial: int
    cell: int
    job_id: str | None
    status: str  # a job status, or pruned
    params: dict[str, Any]
    value: float | None
    best_value: float | None
    steps: int
    job_seconds: float
    pruned_at: int | None


class BestTrial(TypedDict):
    """The best completed trial and the full spec its job trained."""

    trial: int
    job_id: str | None
    params: dict[str, Any]
    value: float
    spec: dict[str, Any]


class BestSoFarPoint(TypedDict):
    trial: int
    value: float
    best: float


class ParallelAxis(TypedDict):
    path: str
    type: str
    low: float | None
    high: float | None
    log: bool
    choices: list[Any] | None


class ParallelLine(TypedDict):
    trial: int
    params: dict[str, Any]
    value: float
    status: str  # succeeded, or pruned (its value: its last evaluation's)


class Parallel(TypedDict):
    """Parallel coordinates: an axis per parameter, a line per completed trial."""

    objective: str
    axes: list[ParallelAxis]
    lines: list[ParallelLine]


class JobSeconds(TypedDict):
    """The compute a search took: in all, by status, and what pruning saved (an estimate)."""

    total: float
    by_status: dict[str, float]
    saved_by_pruning: float


class StudyTrials(TypedDict):
    """A search's trials, its best trial, the best so far, importances and compute."""

    method: str
    objective: str
    direction: Literal["minimize", "maximize"]
    trials: list[Trial]
    best: BestTrial | None
    best_so_far: list[BestSoFarPoint]
    importances: dict[str, float] | None
    parallel: Parallel
    job_seconds: JobSeconds


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
    format: ExportFormat
    sha256: str
    bytes: int
    max_abs_diff: float
    tolerance: float
    details: dict[str, Any]
    file: str
    owner: NotRequired[str | None]
    created_at: str


class Shadow(TypedDict):
    version: int
    percent: int


class Alias(TypedDict):
    alias: str
    version: int
    updated_at: str
    weights: dict[str, int]
    sticky: bool
    shadow: Shadow | None


class HistoryEntry(TypedDict):
    action: str
    alias: str | None
    version: int | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    key_id: str | None
    key_name: str | None
    at: str


class ShadowComparison(TypedDict):
    version: int
    shadow: int
    images: int
    agreement: float | None
    mean_abs_diff: float | None
    mean_latency_ms: float | None
    dropped: int
    failed: int


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
    error: NotRequired[ImageError | None]


class Preprocessing(TypedDict):
    channels: int
    input_size: list[int]  # [height, width]
    resize: int | None  # the shorter side before the centre crop; None: resized whole
    interpolation: str
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


class ExplainedImage(TypedDict):
    file: str
    resize: Literal["none", "resize", "resize+center-crop"]
    explained: ClassScore  # the class explained and its probability
    heatmap: list[list[float]]  # [h][w] at the layer's resolution, 0..1
    upsampled: list[list[float]]  # [H][W] at the net's input size, 0..1


class ExplainTiming(TypedDict):
    explain_ms: float
    total_ms: float


class Explanation(TypedDict):
    model: ServedModel
    preprocessing: Preprocessing
    layer: str  # the net's last residual stage
    results: list[ExplainedImage]
    timing: ExplainTiming


class Health(TypedDict):
    status: NotRequired[str]  # "ok"


class Ready(TypedDict):
    status: str
    checks: dict[str, str]


class Worker(TypedDict):
    """A registered worker process group, and whether its heartbeat is recent."""

    name: str
    host: str
    pid: int
    devices: list[str]  # cpu, or the GPUs it owns
    queues: list[str]
    state: Literal["alive", "lost"]  # lost: unseen for three leases
    current_job: str | None
    jobs_done: int
    started_at: str
    last_seen_at: str


class Session(TypedDict):
    auth_enabled: bool
    scopes: list[str]


class PayloadSegment(TypedDict):
    """One stored segment of a payload log: gzip'd JSON Lines, a record per sampled image."""

    name: str
    records: int
    bytes: int
    first_at: str
    last_at: str
    sha256: str
    file: str


class PayloadPage(TypedDict):
    items: list[PayloadSegment]
    next_cursor: str | None


class DriftWindow(TypedDict):
    images: int
    max_images: int
    max_seconds: float
    first_at: str | None
    last_at: str | None


class DriftReference(TypedDict):
    mean: list[float]
    std: list[float]
    classes: list[str]
    class_distribution: list[float]
    class_source: Literal["uniform", "training_split"]


class ChannelDrift(TypedDict):
    channel: int
    mean: float
    std: float
    shift: float  # |mean served - mean train| / std train
    std_ratio: float


class ClassDrift(TypedDict):
    counts: list[int]
    total_variation: float
    jensen_shannon: float
    p_value: float | None


class Drift(TypedDict):
    """A served model's window of images against its training data (this API process's)."""

    model: str | None
    version: int | None
    job_id: str | None
    window: DriftWindow
    reference: DriftReference | None
    channels: list[ChannelDrift]
    classes: ClassDrift | None
