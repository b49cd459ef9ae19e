"""A study's life: create it (every cell checked first), release its jobs a few at a time,
derive its state from its jobs, cancel and delete it.

Keyword-only service functions over a caller-owned session (the caller commits, then
enqueues the ids that `release` returned). A study's jobs are created queued; those past
its `max_parallel` are *held* (queued, but not on the broker) until a running one ends.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from core import jobs, owners
from core.db.tables import FINAL_STATUSES, JOB_STATUSES, Job, Study, utcnow
from core.errors import ConflictError
from core.owners import ANYONE, Caller
from core.studies import grid, presets


@dataclass(frozen=True)
class Request:
    """A study as asked for: a base train spec, a grid, seeds, and how many run at once."""

    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int]
    name: str | None = None
    tags: tuple[str, ...] = ()
    max_parallel: int = 2
    preset: str | None = None
    scale: str | None = None


def from_preset(
    name: str,
    *,
    dataset: dict[str, Any],
    scale: presets.Scale,
    seeds: int | list[int],
    max_parallel: int,
    title: str | None = None,
    tags: tuple[str, ...] = (),
) -> Request:
    """The request a preset expands to on a dataset, at a scale."""
    plan = presets.get(name).plan(dataset=dataset, scale=scale, seeds=seeds)
    return Request(
        base=plan.base,
        grid=plan.grid,
        seeds=plan.seeds,
        name=title or plan.name,
        tags=tuple(dict.fromkeys([*plan.tags, *tags])),
        max_parallel=max_parallel,
        preset=name,
        scale=scale,
    )


def create(
    *,
    session: Session,
    request: Request,
    max_jobs: int,
    max_attempts: int,
    max_families: int | None = None,
    owner_key_id: uuid.UUID | None = None,
    idempotency_key: str | None = None,
) -> Study:
    """Add the study and all its jobs, held (flushed, not committed); `release` them next.

    `max_families` bounds the net families its cells may have (`grid.expand`)."""
    tags = list(request.tags)
    expanded = grid.expand(
        request.base,
        request.grid,
        request.seeds,
        name=request.name,
        tags=tags,
        max_jobs=max_jobs,
        max_families=max_families,
    )
    preset = presets.get(request.preset) if request.preset else None
    study = Study(
        name=request.name,
        tags=tags,
        spec={
            "base": request.base,
            "grid": request.grid,
            "seeds": request.seeds,
            "preset": request.preset,
            "scale": request.scale,
        },
        preset=request.preset,
        cells=[
            {"values": cell, "paper": preset.paper_number(cell) if preset else None}
            for cell in expanded.cells
        ],
        metric=preset.metric if preset else "final_test_error",
        max_parallel=request.max_parallel,
        idempotency_key=idempotency_key,
        owner_key_id=owner_key_id,
    )
    session.add(study)
    session.flush()
    for cell, _seed, spec in expanded.jobs:
        jobs.create(
            session=session,
            spec=spec,
            max_attempts=max_attempts,
            owner_key_id=owner_key_id,
            study=(study.id, cell, True),
        )
    return study


def get(*, session: Session, study_id: uuid.UUID, caller: Caller = ANYONE) -> Study:
    """The study, or `NotFoundError` (also when the caller may not read it)."""
    return owners.fetch(session, Study, study_id, caller, noun="study")


def _changeable(session: Session, study_id: uuid.UUID, caller: Caller, action: str) -> Study:
    """The study, locked, if the caller may `action` it; else 404 or `NotOwnedError`."""
    return owners.fetch(session, Study, study_id, caller, noun="study", action=action)


def release(*, session: Session, study_id: uuid.UUID) -> list[uuid.UUID]:
    """Let held jobs go while fewer than `max_parallel` are queued or running; their ids."""
    study = session.get(Study, study_id, with_for_update=True)
    if study is None or study.cancel_requested:
        return []
    active = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(
            Job.study_id == study_id,
            or_(Job.status == "running", and_(Job.status == "queued", Job.held.is_(False))),
        )
    )
    free = study.max_parallel - (active or 0)
    if free <= 0:
        return []
    waiting = (
        select(Job.id)
        .where(Job.study_id == study_id, Job.status == "queued", Job.held.is_(True))
        .order_by(Job.created_at, Job.cell)
        .limit(free)
    )
    ids = list(session.scalars(waiting))
    if ids:
        session.execute(update(Job).where(Job.id.in_(ids)).values(held=False, updated_at=utcnow()))
    return ids


def takes_turn(*, session: Session, job: Job) -> bool:
    """Whether a job queued again (a retry) may go now. A study's job waits, held, while
    `max_parallel` of the study's jobs are queued or running; a job of no study, or of a
    cancelled one, goes at once."""
    if job.study_id is None:
        return True
    study = session.get(Study, job.study_id, with_for_update=True)
    if study is None or study.cancel_requested:
        return True
    job.held = True
    session.flush()
    return job.id in release(session=session, study_id=study.id)


def release_after(*, session: Session, job_id: uuid.UUID) -> list[uuid.UUID]:
    """Release the next held jobs of a job's study (after the job ended); their ids."""
    study_id = session.scalar(select(Job.study_id).where(Job.id == job_id))
    return release(session=session, study_id=study_id) if study_id is not None else []


def studies_with_held_jobs(*, session: Session) -> list[uuid.UUID]:
    """Studies that have jobs waiting for their turn (the reaper releases them too)."""
    query = select(Job.study_id).where(Job.held.is_(True), Job.status == "queued").distinct()
    return [study_id for study_id in session.scalars(query) if study_id is not None]


def counts(*, session: Session, study_id: uuid.UUID) -> dict[str, int]:
    """How many of the study's jobs are in each status."""
    rows = session.execute(
        select(Job.status, func.count()).where(Job.study_id == study_id).group_by(Job.status)
    )
    found = Counter({status: int(count) for status, count in rows})
    return {status: found[status] for status in JOB_STATUSES}


def state(study: Study, by_status: dict[str, int]) -> str:
    """queued, running, or once every job ended: succeeded (some job did), failed or cancelled.

    A failed job does not fail its study; it is reported in its cell.
    """
    unfinished = by_status["queued"] + by_status["running"]
    if unfinished:
        started = by_status["running"] + sum(by_status[s] for s in FINAL_STATUSES)
        return "running" if started else "queued"
    if study.cancel_requested:
        return "cancelled"
    return "succeeded" if by_status["succeeded"] else "failed"


def cancel(*, session: Session, study_id: uuid.UUID, caller: Caller = ANYONE) -> Study:
    """Cancel every unfinished job: held and queued ones now, running ones at their next check."""
    study = _changeable(session, study_id, caller, "cancel")
    unfinished = list(
        session.scalars(
            select(Job.id).where(Job.study_id == study_id, Job.status.in_(("queued", "running")))
        )
    )
    if not unfinished:
        raise ConflictError(f"study {study_id} has no unfinished jobs to cancel")
    study.cancel_requested = True
    for job_id in unfinished:
        jobs.request_cancel(session=session, job_id=job_id)
    return study


def delete(*, session: Session, study_id: uuid.UUID, caller: Caller = ANYONE) -> list[uuid.UUID]:
    """Remove the study and its jobs (none may be running); the ids whose files to remove."""
    study = _changeable(session, study_id, caller, "delete")
    job_ids = list(session.scalars(select(Job.id).where(Job.study_id == study_id)))
    for job_id in job_ids:
        jobs.delete(session=session, job_id=job_id)
    session.delete(study)
    session.flush()
    return job_ids
