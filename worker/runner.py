"""Run a claimed job and report everything to the database: the plain functions behind tasks.

A job runs in the prefork child that took its message. A watchdog thread renews the lease
every `heartbeat_seconds`, records progress, notices a cancel request or a lost lease, and
ends a job that overruns its time limit or ignores a cancel. The training thread reports
through `DatabaseSink`, whose every write carries the claim's fencing token.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

import models
from core import jobs
from core.db.session import session_scope
from core.db.tables import Checkpoint, Job
from core.settings import Settings
from core.specs import EvaluateJobSpec, TrainJobSpec
from training import checkpoints
from training.checkpoints import CheckpointInfo
from training.data import LoadedDataset
from training.datasets import load_dataset
from training.evaluate import Evaluation
from training.events import EventSink
from training.loop import fit
from training.recipe import total_iterations
from training.runs import evaluate_checkpoint
from training.specs import DatasetSpec

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # a metric point waits at most this long before it is written...
FLUSH_POINTS = 500  # ...or until this many points are buffered
CANCEL_GRACE_SECONDS = 30.0  # a job still running this long after a cancel is ended by force

# Time limits from a job's budget. Any device the service runs on is assumed to train at
# least this many multiply-accumulates per second (the CPU figure is 25x below what two
# cores reach on ResNet-20), plus a fixed overhead per step; so a slow device never hits
# the limit, while a job that hangs stops holding its GPU long before MAX_JOB_SECONDS.
SLOWEST_MACS_PER_S = {"cpu": 2e9, "cuda": 5e10}
STEP_OVERHEAD_S = 0.05
MIN_LIMIT_S = 600.0
HARD_GRACE_S = 300.0  # after its soft limit the loop has this long to stop by itself


@dataclass(frozen=True)
class TimeLimits:
    """Seconds after which a job is asked to stop (soft) and ended by force (hard)."""

    soft_s: float
    hard_s: float


@dataclass(frozen=True)
class Outcome:
    """How a job ended, for `core.jobs.finish`."""

    status: str
    summary: dict[str, Any] | None = None
    error: str | None = None
    details: str | None = None  # a traceback for the event log


def time_limits(
    steps: int, macs_per_step: float, device: torch.device, max_job_seconds: int
) -> TimeLimits:
    """Soft and hard limits for `steps` training steps, clamped to `max_job_seconds`."""
    rate = SLOWEST_MACS_PER_S.get(device.type, SLOWEST_MACS_PER_S["cpu"])
    # Forward and backward are about three forward passes; one more covers evaluations.
    estimate = MIN_LIMIT_S + steps * (STEP_OVERHEAD_S + 4 * macs_per_step / rate)
    soft = min(estimate, float(max_job_seconds))
    return TimeLimits(soft, soft + HARD_GRACE_S)


def pick_device(settings: Settings) -> torch.device:
    """`settings.device`, else the first visible GPU, else the CPU (one worker per GPU)."""
    if settings.device:
        return torch.device(settings.device)
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def job_dir(settings: Settings, job_id: uuid.UUID) -> Path:
    """Where a job's artifacts live: ARTIFACT_DIR/jobs/<id> (checkpoints/ inside)."""
    return settings.artifact_dir.resolve() / "jobs" / str(job_id)


class Watchdog(threading.Thread):
    """Renews the lease; notes cancel requests and a lost lease; ends a job that overruns."""

    def __init__(self, *, settings: Settings, claim: jobs.Claim) -> None:
        super().__init__(name=f"watchdog-{claim.job_id}", daemon=True)
        self.url, self.claim = settings.database_url, claim
        self.lease_seconds, self.interval = settings.lease_seconds, settings.heartbeat_seconds
        self.limits = TimeLimits(
            float(settings.max_job_seconds), settings.max_job_seconds + HARD_GRACE_S
        )
        self.progress: dict[str, int] = {}
        self.cancelled = threading.Event()
        self.lost = threading.Event()
        self.started = self.renewed = time.monotonic()
        self._cancel_seen: float | None = None
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval) and self.beat():
            self._enforce_limits()

    def stop(self) -> None:
        """Stop renewing (before the job's outcome is written)."""
        self._done.set()
        if self.is_alive():
            self.join()

    def beat(self) -> bool:
        """Renew the lease once; False when the lease is lost and the job must stop."""
        try:
            with session_scope(self.url) as session:
                cancel = jobs.heartbeat(
                    session=session,
                    job_id=self.claim.job_id,
                    token=self.claim.token,
                    lease_seconds=self.lease_seconds,
                    **self.progress,
                )
        except jobs.LeaseLost:
            self.lost.set()
        except SQLAlchemyError as error:
            log.warning("job %s: heartbeat failed: %s", self.claim.job_id, error)
            # Past the lease another worker may own the job: stop rather than race it.
            if time.monotonic() - self.renewed > self.lease_seconds:
                self.lost.set()
        else:
            self.renewed = time.monotonic()
            if cancel:
                self.cancelled.set()
        return not self.lost.is_set()

    @property
    def overtime(self) -> bool:
        """Whether the job is past its soft time limit."""
        return time.monotonic() - self.started > self.limits.soft_s

    def _enforce_limits(self) -> None:
        now = time.monotonic()
        if self.cancelled.is_set():
            self._cancel_seen = self._cancel_seen or now
            if now - self._cancel_seen > CANCEL_GRACE_SECONDS:
                self._end_process("cancelled", None)
        if now - self.started > self.limits.hard_s:
            limit = f"{self.limits.hard_s:.0f} s"
            self._end_process("failed", f"exceeded its hard time limit of {limit}; ended by force")

    def _end_process(self, status: str, error: str | None) -> None:
        """The job's thread is stuck: record the outcome and end this process (frees the GPU)."""
        log.error("job %s: stuck; ending its process as %s", self.claim.job_id, status)
        try:
            with session_scope(self.url) as session:
                jobs.finish(
                    session=session,
                    job_id=self.claim.job_id,
                    token=self.claim.token,
                    status=status,
                    error=error,
                )
        finally:
            os._exit(1)


class DatabaseSink:
    """An `EventSink` writing metrics (in batches), events and checkpoints, all fenced."""

    def __init__(self, *, url: str, claim: jobs.Claim, watchdog: Watchdog) -> None:
        self.url, self.claim, self.watchdog = url, claim, watchdog
        self.pending: list[jobs.Point] = []
        self.flushed_at = time.monotonic()
        self.non_finite: set[str] = set()
        self.best: CheckpointInfo | None = None  # recorded as best.pt

    def on_metrics(self, step: int, epoch: float, values: dict[str, float]) -> None:
        self._check_lease()
        for name, value in values.items():
            if math.isfinite(value):
                self.pending.append(jobs.Point(name, step, float(value), epoch))
            elif name not in self.non_finite:
                self.non_finite.add(name)
                self.on_event("warning", f"{name} is {value} at step {step}; not stored")
        if len(self.pending) >= FLUSH_POINTS:
            self.flush()

    def on_event(self, level: str, message: str) -> None:
        self._check_lease()
        with self._session() as session:
            jobs.add_event(
                session=session,
                job_id=self.claim.job_id,
                level=level,
                message=message,
                token=self.claim.token,
            )

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        self._check_lease()
        self.flush()
        previous = self.best
        if info.is_best:
            self.best = info
            if previous is not None and previous.step != info.step and previous.path.is_file():
                # The replaced best lives on in its step file until the engine prunes it.
                self._record(dataclasses.replace(previous, is_best=False))
        self._record(info)

    def on_progress(self, step: int, total: int) -> None:
        self._check_lease()
        self.watchdog.progress = {"step": step, "total_steps": total}
        if time.monotonic() - self.flushed_at >= FLUSH_SECONDS:
            self.flush()

    def should_stop(self) -> bool:
        watchdog = self.watchdog
        return watchdog.cancelled.is_set() or watchdog.lost.is_set() or watchdog.overtime

    def flush(self) -> None:
        """Write the buffered metric points in one fenced upsert."""
        self.flushed_at = time.monotonic()
        if not self.pending:
            return
        points, self.pending = self.pending, []
        with self._session() as session:
            jobs.write_metrics(
                session=session, job_id=self.claim.job_id, token=self.claim.token, points=points
            )

    def _record(self, info: CheckpointInfo) -> None:
        path, kept = recorded_path(info)
        with self._session() as session:
            jobs.record_checkpoint(
                session=session,
                job_id=self.claim.job_id,
                token=self.claim.token,
                step=info.step,
                epoch=info.epoch,
                path=str(path),
                sha256=info.sha256,
                size=info.bytes,
                is_best=info.is_best,
                kept=kept,
            )

    def _check_lease(self) -> None:
        # Stop at once, writing nothing more: another delivery owns the job now.
        if self.watchdog.lost.is_set():
            raise jobs.LeaseLost(f"job {self.claim.job_id} lost its lease")

    @contextmanager
    def _session(self) -> Iterator[Session]:
        try:
            with session_scope(self.url) as session:
                yield session
        except jobs.LeaseLost:
            self.watchdog.lost.set()
            raise


def recorded_path(info: CheckpointInfo) -> tuple[Path, list[str]]:
    """The file a checkpoint's row names, and the files whose rows stay.

    One row per saved state. The best is recorded as best.pt, which outlives the pruning of
    its step file (a replaced best goes back to its step file); rows of pruned files go.
    """
    directory = info.path.parent
    steps = [str(path) for path in directory.glob("step-*.pt")]
    if info.is_best:
        return directory / checkpoints.BEST, steps
    return info.path, [*steps, str(directory / checkpoints.BEST)]


def execute(job_id: uuid.UUID, *, settings: Settings, worker: str) -> None:
    """Claim the job and run it to its outcome; a delivery that cannot claim returns at once."""
    device = pick_device(settings)
    with session_scope(settings.database_url) as session:
        claim = jobs.claim(
            session=session,
            job_id=job_id,
            worker=worker,
            device=str(device),
            lease_seconds=settings.lease_seconds,
        )
    if claim is None:
        log.info("job %s: not claimable (running elsewhere, or ended); skipped", job_id)
        return
    watchdog = Watchdog(settings=settings, claim=claim)
    sink = DatabaseSink(url=settings.database_url, claim=claim, watchdog=watchdog)
    watchdog.start()
    try:
        outcome = run_claimed(claim, settings=settings, sink=sink, device=device)
        sink.flush()
    except jobs.LeaseLost:
        log.warning("job %s: lease lost; another delivery owns it now", job_id)
        return
    except Exception as error:
        outcome = failure(error)
        _flush_quietly(sink)
    finally:
        watchdog.stop()
    _finish(settings, claim, outcome, watchdog.progress)


def run_claimed(
    claim: jobs.Claim, *, settings: Settings, sink: DatabaseSink, device: torch.device
) -> Outcome:
    """Run a claimed train or evaluate job; returns its outcome."""
    with session_scope(settings.database_url) as session:
        job = session.get(Job, claim.job_id)
        assert job is not None, "a claimed job exists"
        spec_json, kind = job.spec, job.kind
    if kind == "evaluate":
        spec = EvaluateJobSpec.model_validate(spec_json)
        return Outcome("succeeded", evaluate_job(spec, settings=settings, sink=sink, device=device))
    summary = train_job(
        TrainJobSpec.model_validate(spec_json),
        claim.job_id,
        settings=settings,
        sink=sink,
        device=device,
    )
    return train_outcome(summary, sink.watchdog)


def train_job(
    spec: TrainJobSpec,
    job_id: uuid.UUID,
    *,
    settings: Settings,
    sink: DatabaseSink,
    device: torch.device,
) -> dict[str, Any]:
    """Train in the job's folder, resuming from its latest verified checkpoint."""
    out_dir = job_dir(settings, job_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "spec.json").write_text(spec.model_dump_json(indent=2))
    download = settings.allow_downloads
    data = load_dataset(spec.dataset, data_root=settings.data_dir, download=download)
    sink.watchdog.limits = train_limits(spec, data, device, settings.max_job_seconds)
    keep_verified_latest(out_dir / "checkpoints", recorded_sha256(settings, job_id), sink)
    sink.best = recorded_best(settings, job_id, out_dir / "checkpoints")
    summary: dict[str, Any] = json_safe(
        fit(spec, data, out_dir=out_dir, sink=sink, device=device, resume=True)
    )
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def train_limits(
    spec: TrainJobSpec, data: LoadedDataset, device: torch.device, max_job_seconds: int
) -> TimeLimits:
    """The time limits of a train job, from its budget in steps and its MACs per step."""
    recipe, info = spec.recipe, data.info
    steps = total_iterations(recipe, max(1, len(data.train) // recipe.batch_size))
    described = models.describe(
        spec.model.name,
        num_classes=info.num_classes,
        in_channels=info.channels,
        input_size=info.image_size[0],
        **spec.model.options,
    )
    return time_limits(steps, described["macs"] * recipe.batch_size, device, max_job_seconds)


def train_outcome(summary: dict[str, Any], watchdog: Watchdog) -> Outcome:
    """Succeeded, cancelled, or failed for running out of time."""
    if watchdog.lost.is_set():
        raise jobs.LeaseLost(f"job {watchdog.claim.job_id} lost its lease")
    if not summary["stopped"]:
        return Outcome("succeeded", summary)
    if watchdog.cancelled.is_set():
        return Outcome("cancelled", summary)
    limit = f"{watchdog.limits.soft_s:.0f} s"
    reason = f"exceeded its time limit of {limit} (estimated from its budget; MAX_JOB_SECONDS)"
    return Outcome("failed", summary, reason)


def recorded_sha256(settings: Settings, job_id: uuid.UUID) -> dict[str, str]:
    """The sha256 the database holds for each of a job's checkpoint files."""
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(Checkpoint.path, Checkpoint.sha256).where(Checkpoint.job_id == job_id)
        ).all()
    return {path: sha256 for path, sha256 in rows}


def recorded_best(settings: Settings, job_id: uuid.UUID, directory: Path) -> CheckpointInfo | None:
    """The best checkpoint an earlier attempt recorded, as its step file."""
    with session_scope(settings.database_url) as session:
        row = jobs.find_checkpoint(session=session, job_id=job_id, which="best")
        if row is None:
            return None
        path = directory / f"step-{row.step}.pt"
        return CheckpointInfo(path, row.sha256, row.bytes, row.step, row.epoch, is_best=True)


def keep_verified_latest(directory: Path, recorded: dict[str, str], sink: EventSink) -> None:
    """Set aside the newest step checkpoints that fail their sha256 check, until one passes."""
    set_aside = False
    while (latest := checkpoints.latest(directory) if directory.is_dir() else None) is not None:
        problem = _verification_problem(latest, recorded.get(str(latest)))
        if problem is None:
            return
        aside = latest.with_name(f"{latest.name}.corrupt")
        latest.replace(aside)
        set_aside = True
        sink.on_event("warning", f"{latest.name} {problem}; set aside as {aside.name}")
    if set_aside:
        sink.on_event("warning", "no verified checkpoint is left: starting over from step 0")


def _verification_problem(path: Path, expected: str | None) -> str | None:
    """Why `path` cannot be resumed from, or None when its sha256 matches the record."""
    sidecar = path.with_suffix(".sha256")
    if expected is None and sidecar.is_file():
        expected = sidecar.read_text().split()[0]
    if expected is None:
        return "has no recorded sha256"
    if checkpoints.sha256_of(path) != expected:
        return f"does not match its recorded sha256 {expected[:12]}..."
    return None


def evaluate_job(
    spec: EvaluateJobSpec, *, settings: Settings, sink: DatabaseSink, device: torch.device
) -> dict[str, Any]:
    """Evaluate the source job's checkpoint (verified by sha256); returns the summary."""
    with session_scope(settings.database_url) as session:
        row = jobs.find_checkpoint(session=session, job_id=spec.source_job, which=spec.checkpoint)
        source = session.get(Job, spec.source_job)
    if row is None or source is None:
        raise jobs.JobError(f"job {spec.source_job} has no {spec.checkpoint} checkpoint")
    split = spec.dataset.split
    sink.on_event(
        "info",
        f"evaluating {Path(row.path).name} (step {row.step}) of job {spec.source_job} "
        f"on {spec.dataset.name} ({split})",
    )
    started = time.perf_counter()
    result = evaluate_verified(
        Path(row.path),
        row.sha256,
        spec.dataset,
        data_root=settings.data_dir,
        device=device,
        tta_flip=spec.tta,
        download=settings.allow_downloads,
    )
    sink.on_metrics(row.step, float(row.epoch), evaluation_metrics(result, split))
    summary: dict[str, Any] = {
        "source_job": str(spec.source_job),
        "checkpoint": {"step": row.step, "path": row.path, "sha256": row.sha256},
        "dataset": spec.dataset.name,
        "split": split,
        "final_test_error": result.error if split == "test" else None,
        "best_test_error": result.error if split == "test" else None,
        "params": source.params,
        "macs": source.macs,
        "wall_time_s": time.perf_counter() - started,
        **result.as_dict(),
    }
    safe: dict[str, Any] = json_safe(summary)
    return safe


def evaluate_verified(
    path: Path,
    sha256: str,
    dataset: DatasetSpec,
    *,
    data_root: Path,
    device: torch.device,
    tta_flip: bool = False,
    download: bool = False,
) -> Evaluation:
    """Evaluate a checkpoint whose sha256 must be `sha256` (the database's record)."""
    return evaluate_checkpoint(
        path,
        dataset,
        data_root=data_root,
        device=device,
        tta_flip=tta_flip,
        download=download,
        sha256=sha256,
    )


def evaluation_metrics(result: Evaluation, split: str) -> dict[str, float]:
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


def failure(error: BaseException) -> Outcome:
    """A failed outcome: a one-line reason, and the traceback for the event log."""
    lines = str(error).strip().splitlines()
    reason = f"{type(error).__name__}: {lines[0] if lines else 'no message'}"
    details = "".join(traceback.format_exception(error))
    return Outcome("failed", error=reason[:1000], details=details)


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def _flush_quietly(sink: DatabaseSink) -> None:
    """Write what the failed run buffered, if the database lets us."""
    try:
        sink.flush()
    except Exception as error:
        log.warning("job %s: could not write buffered metrics: %s", sink.claim.job_id, error)


def _finish(
    settings: Settings, claim: jobs.Claim, outcome: Outcome, progress: dict[str, int]
) -> None:
    """Write the final progress and the outcome, with a failure's traceback in the log."""
    try:
        with session_scope(settings.database_url) as session:
            jobs.heartbeat(
                session=session,
                job_id=claim.job_id,
                token=claim.token,
                lease_seconds=settings.lease_seconds,
                **progress,
            )
            if outcome.details:
                jobs.add_event(
                    session=session,
                    job_id=claim.job_id,
                    level="error",
                    message=outcome.details,
                    token=claim.token,
                )
            jobs.finish(
                session=session,
                job_id=claim.job_id,
                token=claim.token,
                status=outcome.status,
                error=outcome.error,
                summary=outcome.summary,
            )
    except jobs.LeaseLost:
        log.warning("job %s: lease lost before its outcome was written", claim.job_id)
        return
    log.info("job %s: %s", claim.job_id, outcome.status)
