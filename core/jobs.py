"""A job's life in the database: create, claim, heartbeat, write, finish, cancel, reap.

Keyword-only service functions over a caller-owned session (the caller commits). Every
write a worker makes goes through `_fence`, a conditional UPDATE on the job's fencing
token: a worker whose lease was taken over can no longer write anything.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core import artifacts, kinds, owners, resources, workers
from core.db.tables import (
    ACTIVE_STATUSES,
    FINAL_STATUSES,
    Checkpoint,
    Event,
    Job,
    Metric,
    ModelVersion,
    RegisteredModel,
    utcnow,
)
from core.errors import ConflictError
from core.kinds.base import KindSpec
from core.owners import ANYONE, Caller
from core.settings import Settings


class LeaseLost(RuntimeError):  # noqa: N818 (a state, as in "the lease is lost")
    """This worker no longer owns the job: another delivery took it over, or it ended."""


@dataclass(frozen=True)
class Claim:
    """A worker's hold on a job: the fencing token that its writes must carry."""

    job_id: uuid.UUID
    token: int
    attempt: int


@dataclass(frozen=True)
class Point:
    """One metric value at one step."""

    name: str
    step: int
    value: float
    epoch: float | None = None


def get(*, session: Session, job_id: uuid.UUID, caller: Caller = ANYONE) -> Job:
    """The job, or `NotFoundError` (also when the caller may not read it)."""
    return owners.fetch(session, Job, job_id, caller, noun="job")


def _changeable(session: Session, job_id: uuid.UUID, caller: Caller, action: str) -> Job:
    """The job, locked, if the caller may `action` it; else 404 or `NotOwnedError`."""
    return owners.fetch(session, Job, job_id, caller, noun="job", action=action)


def create(
    *,
    session: Session,
    settings: Settings,
    spec: KindSpec,
    max_attempts: int,
    owner_key_id: uuid.UUID | None = None,
    idempotency_key: str | None = None,
    study: tuple[uuid.UUID, int, bool] | None = None,
) -> Job:
    """Add a queued job for `spec` (flushed, not committed), its kind's facts judged with
    `settings`' budgets.

    `study` makes it a study's job: the study, the job's cell, and whether it is held.
    """
    stored, facts = kinds.get(spec.kind).record(session, settings, spec)
    job = Job(
        kind=spec.kind,
        name=spec.name,
        tags=list(spec.tags),
        spec=stored.model_dump(mode="json"),
        model_name=facts.model_name,
        model_family=facts.model_family,
        depth=facts.depth,
        dataset_name=facts.dataset_name,
        source_job_id=facts.source_job_id,
        max_attempts=max_attempts,
        owner_key_id=owner_key_id,
        idempotency_key=idempotency_key,
    )
    if study is not None:
        job.study_id, job.cell, job.held = study
    session.add(job)
    session.flush()
    add_event(session=session, job_id=job.id, level="info", message="queued")
    _note_unserved(session, job, settings.lease_seconds)
    return job


def _note_unserved(session: Session, job: Job, lease_seconds: int) -> None:
    """Say so in the job's log when it needs a GPU and no live worker serves its queue."""
    needs = resources.of_spec(job.spec)
    if not needs.gpus:
        return  # every worker takes a job a CPU may run
    queue = resources.queue_for(needs.gpus)
    if workers.serving(session=session, queue=queue, lease_seconds=lease_seconds):
        return
    add_event(
        session=session,
        job_id=job.id,
        level="warning",
        message=f"waiting for {resources.describe(needs)} (queue {queue}): no live worker "
        "takes it now; it stays queued until one starts",
    )


def claim(
    *, session: Session, job_id: uuid.UUID, worker: str, device: str, lease_seconds: int
) -> Claim | None:
    """Take the job if it is queued or its lease expired; None if someone else holds it."""
    now = utcnow()
    claimable = or_(
        and_(Job.status == "queued", Job.held.is_(False)),
        and_(Job.status == "running", Job.lease_expires_at < now),
    )
    row = session.execute(
        update(Job)
        .where(Job.id == job_id, claimable, Job.cancel_requested.is_(False))
        .values(
            status="running",
            attempt=Job.attempt + 1,
            fencing_token=Job.fencing_token + 1,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            worker=worker,
            device=device,
            started_at=now,
            error=None,
        )
        .returning(Job.fencing_token, Job.attempt, Job.max_attempts)
    ).one_or_none()
    if row is None:
        return None
    token, attempt, max_attempts = row
    if attempt > max_attempts:
        reason = f"gave up after {max_attempts} attempts (workers died or lost their lease)"
        finish(session=session, job_id=job_id, token=token, status="failed", error=reason)
        return None
    add_event(
        session=session,
        job_id=job_id,
        level="info",
        message=f"attempt {attempt} on {worker} ({device})",
    )
    return Claim(job_id, token, attempt)


def _fence(session: Session, job_id: uuid.UUID, token: int, **values: Any) -> bool:
    """Touch the job if `token` still owns it; return its cancel flag, or raise LeaseLost."""
    row = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.fencing_token == token, Job.status == "running")
        .values(updated_at=utcnow(), **values)
        .returning(Job.cancel_requested)
    ).one_or_none()
    if row is None:
        raise LeaseLost(f"job {job_id} is no longer held with token {token}")
    return bool(row[0])


def heartbeat(
    *, session: Session, job_id: uuid.UUID, token: int, lease_seconds: int, **progress: Any
) -> bool:
    """Renew the lease (and record progress); returns whether a cancel was requested."""
    lease = utcnow() + timedelta(seconds=lease_seconds)
    return _fence(session, job_id, token, lease_expires_at=lease, **progress)


def write_metrics(
    *, session: Session, job_id: uuid.UUID, token: int, points: Sequence[Point]
) -> None:
    """Upsert metric points: a re-run of the same step replaces, never duplicates."""
    _fence(session, job_id, token)
    if not points:
        return
    rows = [
        {"job_id": job_id, "name": p.name, "step": p.step, "value": p.value, "epoch": p.epoch}
        for p in points
    ]
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    statement = insert(Metric).values(rows)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["job_id", "name", "step"],
            set_={"value": statement.excluded.value, "epoch": statement.excluded.epoch},
        )
    )


def record_checkpoint(
    *,
    session: Session,
    job_id: uuid.UUID,
    token: int,
    step: int,
    epoch: int,
    path: str,
    sha256: str,
    size: int,
    is_best: bool,
    kept: Iterable[str],
) -> None:
    """Record a checkpoint file; forget rows of files the engine pruned (not in `kept`)."""
    _fence(session, job_id, token)
    existing = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)).all()
    kept_paths = set(kept)
    for row in existing:
        if row.step == step or row.path not in kept_paths:
            session.delete(row)
        elif is_best:
            row.is_best = False
    session.add(
        Checkpoint(
            job_id=job_id,
            step=step,
            epoch=epoch,
            path=path,
            sha256=sha256,
            bytes=size,
            is_best=is_best,
        )
    )


def record_run(
    *,
    session: Session,
    job_id: uuid.UUID,
    token: int,
    data: dict[str, Any] | None,
    environment: dict[str, Any],
) -> None:
    """Record what a running job read and runs on: its data's provenance (and digest, which
    the job list filters by) and its environment (`training.environment`)."""
    digest = data.get("digest") if data else None
    _fence(session, job_id, token, data_digest=digest, data=data, environment=environment)


def add_event(
    *, session: Session, job_id: uuid.UUID, level: str, message: str, token: int | None = None
) -> None:
    """Append a line to the job's log (fenced when a worker writes it)."""
    if token is not None:
        _fence(session, job_id, token)
    session.add(Event(job_id=job_id, level=level, message=message))


def finish(
    *,
    session: Session,
    job_id: uuid.UUID,
    token: int,
    status: str,
    error: str | None = None,
    summary: dict[str, Any] | None = None,
) -> None:
    """End the job as succeeded, failed or cancelled, with its summary columns."""
    columns = _summary_columns(summary) if summary else {}
    _fence(
        session,
        job_id,
        token,
        status=status,
        error=error,
        finished_at=utcnow(),
        lease_expires_at=None,
        summary=summary,
        **columns,
    )
    add_event(
        session=session, job_id=job_id, level="error" if error else "info", message=error or status
    )


SUMMARY_COLUMNS = (
    "final_test_error",
    "best_test_error",
    "params",
    "macs",
    "wall_time_s",
    "images_per_s",
)


def _summary_columns(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: summary.get(key) for key in SUMMARY_COLUMNS}


def request_cancel(*, session: Session, job_id: uuid.UUID, caller: Caller = ANYONE) -> Job:
    """Cancel a queued job now; ask a running one to stop (its worker ends it)."""
    job = _changeable(session, job_id, caller, "cancel")
    if job.status in FINAL_STATUSES:
        raise ConflictError(f"job {job_id} is already {job.status}")
    if job.status == "queued":
        job.status, job.finished_at = "cancelled", utcnow()
        add_event(session=session, job_id=job_id, level="info", message="cancelled while queued")
    else:
        job.cancel_requested = True
        add_event(session=session, job_id=job_id, level="info", message="cancel requested")
    return job


def edit(
    *, session: Session, job_id: uuid.UUID, changes: dict[str, Any], caller: Caller = ANYONE
) -> Job:
    """Change a job's tags and note (any status); only its owner or an admin may."""
    job = _changeable(session, job_id, caller, "edit")
    if "tags" in changes:
        job.tags = list(changes["tags"])
    if "note" in changes:
        job.note = changes["note"] or None  # an empty note is no note
    session.flush()
    return job


RETRYABLE = ("failed", "cancelled", "pruned")


@dataclass(frozen=True)
class Retry:
    """A job sent back to the queue, and the step its next run resumes from (None: 0)."""

    job: Job
    resume_step: int | None
    message: str


def retry(
    *,
    session: Session,
    settings: Settings,
    job_id: uuid.UUID,
    caller: Caller = ANYONE,
) -> Retry:
    """Queue a failed, cancelled or pruned job again, to resume from its last verified
    checkpoint.

    It gets `MAX_ATTEMPTS` more deliveries; its metrics continue on the same step axis.
    """
    job = _changeable(session, job_id, caller, "retry")
    if job.status not in RETRYABLE:
        hint = "; cancel it first" if job.status in ACTIVE_STATUSES else ""
        raise ConflictError(
            f"job {job_id} is {job.status}: only a failed, cancelled or pruned job can be "
            f"retried{hint}"
        )
    resume = artifacts.last_verified(session=session, settings=settings, job_id=job_id)
    message = (
        f"retried: resumes from {resume[0].name} at step {resume[1]}"
        if resume is not None
        else "retried: no verified checkpoint, so it starts over from step 0"
    )
    job.status, job.held, job.cancel_requested = "queued", False, False
    job.error = job.finished_at = job.lease_expires_at = job.summary = None
    for column in SUMMARY_COLUMNS:
        setattr(job, column, None)
    job.max_attempts = job.attempt + settings.max_attempts
    add_event(session=session, job_id=job_id, level="info", message=message)
    session.flush()
    return Retry(job, resume[1] if resume else None, message)


def delete(*, session: Session, job_id: uuid.UUID, caller: Caller = ANYONE) -> Job:
    """Remove a job that is not running; its metrics, checkpoints and events cascade."""
    job = _changeable(session, job_id, caller, "delete")
    if job.status == "running":
        raise ConflictError(f"job {job_id} is running; cancel it first and delete it once it ends")
    serving = session.execute(
        select(RegisteredModel.name, ModelVersion.version)
        .join(ModelVersion, ModelVersion.model_id == RegisteredModel.id)
        .where(ModelVersion.job_id == job_id)
    ).all()
    if serving:
        versions = ", ".join(f"{name}/{version}" for name, version in serving)
        raise ConflictError(
            f"job {job_id} is registered as {versions}; delete those versions first"
        )
    session.delete(job)
    session.flush()
    return job


def take_expired(*, session: Session, lease_seconds: int) -> list[uuid.UUID]:
    """Take the running jobs whose lease ran out, for re-enqueueing (one reaper, once a lease)."""
    cutoff = utcnow() - timedelta(seconds=lease_seconds)
    abandoned = and_(
        Job.status == "running",
        Job.lease_expires_at < utcnow(),
        Job.cancel_requested.is_(False),
        Job.updated_at < cutoff,
    )
    # Rows locked by a writer are skipped, not waited for: a writer frozen mid-transaction
    # must not hold up the reaping of every other job (its lock goes with its session).
    unlocked = select(Job.id).where(abandoned).with_for_update(skip_locked=True)
    return _take(session, unlocked, abandoned)


def take_stale_queued(*, session: Session, older_than_s: float, limit: int) -> list[uuid.UUID]:
    """Take the oldest `limit` queued jobs untouched for `older_than_s` (message maybe lost)."""
    if limit <= 0:
        return []
    stale = and_(
        Job.status == "queued",
        Job.held.is_(False),
        Job.updated_at < utcnow() - timedelta(seconds=older_than_s),
    )
    oldest = select(Job.id).where(stale).order_by(Job.created_at).limit(limit)
    return _take(session, oldest, stale)


def _take(
    session: Session, chosen: Select[uuid.UUID], still: ColumnElement[bool]
) -> list[uuid.UUID]:
    """The ids of the `chosen` jobs that are `still` so, their updated_at touched."""
    # Touching updated_at is the taker's claim: a concurrent taker re-checks `still`.
    return list(
        session.scalars(
            update(Job)
            .where(Job.id.in_(chosen.scalar_subquery()), still)
            .values(updated_at=utcnow())
            .returning(Job.id)
        )
    )


def count_queued(*, session: Session) -> int:
    """How many jobs wait in the queued state with a message on the broker (not held)."""
    waiting = and_(Job.status == "queued", Job.held.is_(False))
    return session.scalar(select(func.count()).select_from(Job).where(waiting)) or 0


def cancel_abandoned(*, session: Session) -> list[uuid.UUID]:
    """End as cancelled the running jobs asked to cancel whose worker died before it could."""
    ids = list(
        session.scalars(
            update(Job)
            .where(
                Job.status == "running",
                Job.cancel_requested.is_(True),
                Job.lease_expires_at < utcnow(),
            )
            .values(status="cancelled", finished_at=utcnow(), lease_expires_at=None)
            .returning(Job.id)
        )
    )
    for job_id in ids:
        add_event(
            session=session,
            job_id=job_id,
            level="info",
            message="cancelled (its worker had stopped)",
        )
    return ids


def hand_back(*, session: Session, job_id: uuid.UUID, token: int, reason: str) -> None:
    """Put a running job back in the queue now (its worker is stopping), to resume elsewhere.

    A handed-back run was not a failed attempt: its maximum grows by one, so that restarts of
    the workers never make a job give up.
    """
    _fence(
        session,
        job_id,
        token,
        status="queued",
        lease_expires_at=None,
        max_attempts=Job.max_attempts + 1,
    )
    add_event(session=session, job_id=job_id, level="warning", message=f"handed back: {reason}")
