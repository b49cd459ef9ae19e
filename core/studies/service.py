"""A study's life: create it (every cell checked first), release its jobs a few at a time,
derive its state from its jobs, cancel and delete it.

Keyword-only service functions over a caller-owned session (the caller commits, then
enqueues the ids that `release` returned). A study's jobs are created queued; those past
its `max_parallel` are *held* (queued, but not on the broker) until a running one ends.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from core import jobs, owners
from core.db.tables import ACTIVE_STATUSES, FINAL_STATUSES, JOB_STATUSES, Job, Study, utcnow
from core.errors import ConflictError, InvalidError
from core.owners import ANYONE, Caller
from core.settings import Settings
from core.studies import grid, presets, search


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
    search: search.Search | None = None  # None: the grid's cells x seeds


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
    settings: Settings,
    request: Request,
    max_jobs: int,
    max_attempts: int,
    max_families: int | None = None,
    owner_key_id: uuid.UUID | None = None,
    idempotency_key: str | None = None,
) -> Study:
    """Add the study and all its jobs, held (flushed, not committed); `release` them next.
    Its cells are held to the budgets of `settings`.

    `max_families` bounds the net families its cells may have (`grid.expand`). A search
    adds no job here: `release` asks for its first trials."""
    tags = list(request.tags)
    if request.search is not None:
        return _create_search(
            session=session,
            settings=settings,
            request=request,
            max_jobs=max_jobs,
            owner_key_id=owner_key_id,
            idempotency_key=idempotency_key,
        )
    expanded = expand(
        request=request, settings=settings, max_jobs=max_jobs, max_families=max_families
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
            settings=settings,
            spec=spec,
            max_attempts=max_attempts,
            owner_key_id=owner_key_id,
            study=(study.id, cell, True),
        )
    return study


def expand(
    *, request: Request, settings: Settings, max_jobs: int, max_families: int | None = None
) -> grid.Expanded:
    """A grid request's cells, each with its jobs' specs, held to the budgets given."""
    return grid.expand(
        request.base,
        request.grid,
        request.seeds,
        settings=settings,
        name=request.name,
        tags=list(request.tags),
        max_jobs=max_jobs,
        max_families=max_families,
    )


def check(*, request: Request, settings: Settings, max_jobs: int) -> None:
    """`InvalidError` unless a search request can run: no grid, one seed, a budget within
    `max_jobs`, and a space whose every bound makes a valid spec."""
    found = request.search
    assert found is not None, "a search request"
    if found.trials > max_jobs:
        raise InvalidError(
            f"the search asks for {found.trials} trials, over the limit of {max_jobs} jobs "
            "a study (MAX_STUDY_JOBS)",
            field=("body", "trials"),
        )
    if request.grid:
        raise InvalidError(
            "a search samples its space and takes no grid: put fixed values into base and "
            "searched ones into space",
            field=("body", "grid"),
        )
    if len(request.seeds) != 1:
        raise InvalidError(
            "a search runs each trial on one seed (its configurations are compared on the "
            "same one): give seeds as 1 or [seed]; to measure the best trial's spread, run a "
            "grid of its spec with seeds",
            field=("body", "seeds"),
        )
    grid.check_nesting(request.base, {path: [param] for path, param in found.space.items()})
    search.check(
        found,
        request.base,
        settings=settings,
        seed=request.seeds[0],
        name=request.name,
        tags=list(request.tags),
    )


def _create_search(
    *,
    session: Session,
    settings: Settings,
    request: Request,
    max_jobs: int,
    owner_key_id: uuid.UUID | None,
    idempotency_key: str | None,
) -> Study:
    """Add a search study, its space checked against the base; it has no trial yet."""
    check(request=request, settings=settings, max_jobs=max_jobs)
    found = request.search
    assert found is not None
    study = Study(
        name=request.name,
        tags=list(request.tags),
        spec={
            "base": request.base,
            "grid": {},
            "seeds": request.seeds,
            "preset": None,
            "scale": None,
            "search": found.record(),
        },
        preset=None,
        cells=[],
        metric="final_test_error",
        max_parallel=request.max_parallel,
        search=found.method,
        idempotency_key=idempotency_key,
        owner_key_id=owner_key_id,
    )
    session.add(study)
    session.flush()
    return study


def get(*, session: Session, study_id: uuid.UUID, caller: Caller = ANYONE) -> Study:
    """The study, or `NotFoundError` (also when the caller may not read it)."""
    return owners.fetch(session, Study, study_id, caller, noun="study")


def _changeable(session: Session, study_id: uuid.UUID, caller: Caller, action: str) -> Study:
    """The study, locked, if the caller may `action` it; else 404 or `NotOwnedError`."""
    return owners.fetch(session, Study, study_id, caller, noun="study", action=action)


def release(*, session: Session, settings: Settings, study_id: uuid.UUID) -> list[uuid.UUID]:
    """Let held jobs go while fewer than `max_parallel` are queued or running, then (a
    search) ask for new trials in the room left; their ids."""
    study = session.get(Study, study_id, with_for_update=True)
    if study is not None and study.search is not None:
        study = search.lock(session, study_id)  # two askers never sample the same trial
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
    if search.wants_more(study) and free > len(ids):
        ids += search.ask(
            session=session,
            settings=settings,
            study=study,
            count=free - len(ids),
            max_attempts=settings.max_attempts,
        )
    return ids


def takes_turn(*, session: Session, settings: Settings, job: Job) -> bool:
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
    return job.id in release(session=session, settings=settings, study_id=study.id)


def release_after(*, session: Session, settings: Settings, job_id: uuid.UUID) -> list[uuid.UUID]:
    """Release the next held jobs of a job's study (after the job ended), or its next
    trials; their ids."""
    study_id = session.scalar(select(Job.study_id).where(Job.id == job_id))
    if study_id is None:
        return []
    return release(session=session, settings=settings, study_id=study_id)


def studies_with_held_jobs(*, session: Session) -> list[uuid.UUID]:
    """Studies that have jobs waiting for their turn, and searches with trials left to ask
    for (the reaper releases them too)."""
    query = select(Job.study_id).where(Job.held.is_(True), Job.status == "queued").distinct()
    held = [study_id for study_id in session.scalars(query) if study_id is not None]
    searching = session.scalars(
        select(Study).where(Study.search.is_not(None), Study.cancel_requested.is_(False))
    )
    return list(dict.fromkeys([*held, *(s.id for s in searching if search.wants_more(s))]))


def counts(*, session: Session, study_id: uuid.UUID) -> dict[str, int]:
    """How many of the study's jobs are in each status."""
    rows = session.execute(
        select(Job.status, func.count()).where(Job.study_id == study_id).group_by(Job.status)
    )
    found = Counter({status: int(count) for status, count in rows})
    return {status: found[status] for status in JOB_STATUSES}


def state(study: Study, by_status: dict[str, int]) -> str:
    """queued, running, or once every job ended: succeeded (some job did), failed or cancelled.

    A failed (or pruned) job does not fail its study; it is reported in its cell.
    """
    unfinished = by_status["queued"] + by_status["running"]
    if unfinished or search.wants_more(study):  # a search with trials still to ask for
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
            select(Job.id).where(Job.study_id == study_id, Job.status.in_(ACTIVE_STATUSES))
        )
    )
    if not unfinished:
        raise ConflictError(f"study {study_id} has no unfinished jobs to cancel")
    study.cancel_requested = True
    for job_id in unfinished:
        jobs.request_cancel(session=session, job_id=job_id)
    return study


def extend(
    *,
    session: Session,
    settings: Settings,
    study_id: uuid.UUID,
    add_seeds: int | dict[int, int] | None = None,
    add_trials: int | None = None,
    caller: Caller = ANYONE,
) -> Study:
    """Add seeds to every cell (`add_seeds` a number) or to chosen ones ({cell: seeds}), or
    trials to a search; the new jobs are held until `release` lets them go. Each cell's new
    seeds are the smallest it has not run; its jobs join the same results."""
    study = _changeable(session, study_id, caller, "extend")
    if study.cancel_requested:
        raise ConflictError(f"study {study_id} was cancelled; submit a new study instead")
    found = search.of_study(study)
    if (add_seeds is None) == (add_trials is None):
        raise InvalidError("give add_seeds or add_trials", field=("body",))
    if found is not None:
        if add_seeds is not None:
            raise InvalidError(
                "a search runs each trial on one seed: give add_trials; to measure a trial's "
                "spread, run a grid of its spec with seeds",
                field=("body", "add_seeds"),
            )
        assert add_trials is not None
        _check_total(session, study, add_trials, settings.max_study_jobs)
        study.spec = {
            **study.spec,
            "search": {**found.record(), "trials": found.trials + add_trials},
        }
        _log_extension(study, {"add_trials": add_trials})
        session.flush()
        return study
    if add_trials is not None:
        raise InvalidError(
            "add_trials extends a search; a grid takes add_seeds", field=("body", "add_trials")
        )
    assert add_seeds is not None
    wanted = _seeds_wanted(study, add_seeds)
    _check_total(session, study, sum(wanted.values()), settings.max_study_jobs)
    used: defaultdict[int, set[int]] = defaultdict(set)
    for cell, spec in session.execute(select(Job.cell, Job.spec).where(Job.study_id == study_id)):
        used[cell or 0].add(int(spec["recipe"]["seed"]))
    for index, count in wanted.items():
        values = study.cells[index]["values"]
        unused = itertools.filterfalse(used[index].__contains__, itertools.count())
        for new in itertools.islice(unused, count):
            payload = grid.payload_of(
                study.spec["base"], values, new, name=study.name, tags=list(study.tags)
            )
            spec = grid.validated(settings, payload, index, values)
            jobs.create(
                session=session,
                settings=settings,
                spec=spec,
                max_attempts=settings.max_attempts,
                owner_key_id=study.owner_key_id,
                study=(study.id, index, True),
            )
    _log_extension(study, {"add_seeds": {str(k): v for k, v in wanted.items()}})
    session.flush()
    return study


def _seeds_wanted(study: Study, add_seeds: int | dict[int, int]) -> dict[int, int]:
    """The seeds to add per cell index, or `InvalidError` for a cell the study lacks."""
    if isinstance(add_seeds, int):
        return {index: add_seeds for index in range(len(study.cells))}
    for index in add_seeds:
        if not 0 <= index < len(study.cells):
            raise InvalidError(
                f"the study has no cell {index}: its cells are 0 to {len(study.cells) - 1}",
                field=("body", "add_seeds", str(index)),
            )
    return {index: count for index, count in add_seeds.items() if count}


def _check_total(session: Session, study: Study, adding: int, max_jobs: int) -> None:
    have = session.scalar(select(func.count()).select_from(Job).where(Job.study_id == study.id))
    if (have or 0) + adding > max_jobs:
        raise InvalidError(
            f"the study has {have} jobs; {adding} more would pass the limit of {max_jobs} "
            "(MAX_STUDY_JOBS)",
            field=("body",),
        )


def _log_extension(study: Study, change: dict[str, Any]) -> None:
    """Keep what was added, and when, in the study's spec."""
    history = [*study.spec.get("extensions", []), {**change, "at": utcnow().isoformat()}]
    study.spec = {**study.spec, "extensions": history}


def delete(*, session: Session, study_id: uuid.UUID, caller: Caller = ANYONE) -> list[uuid.UUID]:
    """Remove the study and its jobs (none may be running); the ids whose files to remove."""
    study = _changeable(session, study_id, caller, "delete")
    job_ids = list(session.scalars(select(Job.id).where(Job.study_id == study_id)))
    for job_id in job_ids:
        jobs.delete(session=session, job_id=job_id)
    session.delete(study)
    session.flush()
    return job_ids
