"""A job's read side: the job list (keyset pages of `core.listing`), what a job row shows
(`fields`, `state`), downsampled curves, and a job's live tail. `core.jobs` is its write side.

Portable between Postgres and SQLite; the tag filter and JSON paths differ by dialect.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, String, cast, exists, func, literal, select, union_all
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session, defer

from client.filters import JobFilter
from client.wire import API_PREFIX
from core import job_search, listing, resources
from core.db.tables import Event, Job, Metric
from core.errors import InvalidError
from core.listing import Page
from core.owners import ANYONE, Caller

Parsed = TypeVar("Parsed")
RESULTS = ("final_test_error", "best_test_error", "params", "macs", "wall_time_s", "images_per_s")
STATE = ("status", "attempt", "cancel_requested", "error", "step", "total_steps")


def fields(job: Job) -> dict[str, Any]:
    """What a job row shows a client, as the runs table lists it (no spec, no summary)."""
    columns = (
        *("id", "kind", "status", "name", "tags", "note", "depth", "attempt", "max_attempts"),
        *("worker", "device", "error", "cancel_requested"),
        *("created_at", "started_at", "finished_at"),
    )
    shown: dict[str, Any] = {column: getattr(job, column) for column in columns}
    needs = resources.of_spec(job.spec)
    waiting = job.status == "queued" and not job.held
    return shown | {
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
        "results": {key: getattr(job, key) for key in RESULTS},
        "links": links(job.id),
    }


def links(job_id: uuid.UUID) -> dict[str, str]:
    """Where to read more about job `job_id`, or act on it."""
    base = f"{API_PREFIX}/jobs/{job_id}"
    named = ("metrics", "events", "checkpoints", "cancel")
    return {"self": base} | {name: f"{base}/{name}" for name in named}


def state(job: Job) -> dict[str, Any]:
    """Where a job is in its life: status, attempt, cancel flag, error, step of total."""
    return {name: getattr(job, name) for name in STATE}


def list_jobs(
    *,
    session: Session,
    filters: JobFilter,
    caller: Caller = ANYONE,
    limit: int | None,
    cursor: str | None = None,
    documents: bool = False,
) -> Page[Job]:
    """One page of the jobs the caller may read that pass `filters`, in their `sort` (a
    sort key of `core.job_search`, nulls last, ties by id), after `cursor`.

    `documents` loads each job's summary too."""
    order = job_order(filters.sort, session.get_bind().dialect.name)
    query = select(Job)
    if not documents:
        # The runs table reads the spec (a job's queue and needs), never the whole summary;
        # a deferred spec would cost each row a query of its own.
        query = query.options(defer(Job.summary), defer(Job.data), defer(Job.environment))
    query = query.where(*_conditions(filters, session.get_bind().dialect.name))
    return listing.page(
        session=session,
        query=query,
        order=order,
        caller=caller,
        owner=Job.owner_key_id,
        asked_owner=filters.owner,
        limit=limit,
        cursor=cursor,
    )


def job_order(sort: str, dialect: str) -> listing.Order:
    """The list's order for a sort key of `core.job_search`: its value, then the id."""
    key = _parsed(job_search.parse_sort, sort, "sort")
    column = job_search.sort_expression(key.field, dialect)
    kind: listing.KeyKind = "time" if key.field.is_time else "number"
    nullable = key.field.column != "created_at"
    first = listing.Key(key.field.name, column, kind, nullable=nullable, label="value")
    keys = (first, listing.Key("id", Job.id, "id"))
    return listing.Order(sort, keys, descending=key.descending, noun="job")


def _conditions(filters: JobFilter, dialect: str) -> list[ColumnElement[bool]]:
    """The WHERE clauses of `filters` (but the owner's: `core.owners.visible`)."""
    conditions: list[ColumnElement[bool]] = []
    if filters.status:
        conditions.append(Job.status.in_(filters.status))
    equal = {
        Job.kind: filters.kind,
        Job.model_name: filters.model,
        Job.model_family: filters.family,
        Job.dataset_name: filters.dataset,
        Job.study_id: filters.study,
    }
    conditions += [column == value for column, value in equal.items() if value is not None]
    conditions += [_has_tag(tag, dialect) for tag in filters.tag]
    if filters.q:
        conditions.append(Job.name.ilike(f"%{job_search.escape_like(filters.q)}%", escape="\\"))
    wheres = [_parsed(job_search.parse_filter, text, "filter") for text in filters.filter]
    conditions += [job_search.condition(where, dialect) for where in wheres]
    return conditions


def _parsed(parse: Callable[[str], Parsed], text: str, name: str) -> Parsed:
    """`parse(text)`, or `InvalidError` naming the query parameter."""
    try:
        return parse(text)
    except ValueError as error:
        raise InvalidError(str(error), field=("query", name)) from None


def _has_tag(tag: str, dialect: str) -> ColumnElement[bool]:
    """Whether the job's JSON list of tags holds `tag`."""
    if dialect == "postgresql":
        return cast(Job.tags, JSONB).contains([tag])
    each = func.json_each(Job.tags).table_valued("value")
    return exists(select(1).select_from(each).where(each.c.value == tag))


def metric_series(
    *, session: Session, job_id: uuid.UUID, names: Sequence[str], max_points: int
) -> dict[str, tuple[list[int], list[float]]]:
    """Each metric as (steps, values), at most `max_points` per metric.

    A series spanning up to `SAMPLE_SPAN` steps is bucket means; a longer one on Postgres
    is sampled: the first point at or after each of `max_points` evenly spaced steps.
    """
    wanted = list(names) or metric_names(session=session, job_id=job_id)
    sample = session.get_bind().dialect.name == "postgresql"
    series: dict[str, tuple[list[int], list[float]]] = {}
    for start in range(0, len(wanted), _BRANCHES):
        chunk = wanted[start : start + _BRANCHES]
        spans = _spans(session, job_id, chunk) if sample else [0] * len(chunk)
        branches = [
            _sampled(job_id, name, max_points)
            if span > SAMPLE_SPAN
            else _buckets(job_id, name, max_points)
            for name, span in zip(chunk, spans, strict=True)
        ]
        parts = union_all(*branches).subquery()
        query = select(parts.c.name, parts.c.step, parts.c.value).order_by("name", "step")
        for name, step, value in session.execute(query):
            steps, values = series.setdefault(name, ([], []))
            steps.append(step)
            values.append(value)
    return series


# One statement reads this many series (SQLite allows 500 parts in a compound SELECT).
_BRANCHES = 100
# Bucket means read every row of a series (about 0.5 us a row on Postgres here): past this
# many steps a series is sampled instead, one index probe per point.
SAMPLE_SPAN = 20_000


def _spans(session: Session, job_id: uuid.UUID, names: Sequence[str]) -> list[int]:
    """Each series' last step minus its first, two index probes per series."""
    columns = [
        select(func.max(Metric.step) - func.min(Metric.step))
        .where(Metric.job_id == job_id, Metric.name == name)
        .scalar_subquery()
        for name in names
    ]
    row = session.execute(select(*columns)).one()
    return [span or 0 for span in row]


def _sampled(job_id: uuid.UUID, name: str, max_points: int) -> Select[tuple[str, int, float]]:
    """One series sampled: the first point at or after each of max_points spaced steps."""
    where = (Metric.job_id == job_id, Metric.name == name)
    lo = select(func.min(Metric.step)).where(*where).scalar_subquery()
    hi = select(func.max(Metric.step)).where(*where).scalar_subquery()
    width = (hi - lo + max_points) // max_points
    targets = select(func.generate_series(lo, hi, width).label("target")).subquery("targets")
    point = (
        select(Metric.step, Metric.value)
        .where(*where, Metric.step >= targets.c.target)
        .order_by(Metric.step)
        .limit(1)
        .lateral("point")
    )
    return (
        select(literal(name, String).label("name"), point.c.step, point.c.value)
        .select_from(targets.join(point, literal(True)))
        .distinct()
    )


def _buckets(job_id: uuid.UUID, name: str, max_points: int) -> Select[tuple[str, int, float]]:
    """One series' bucket means: its own [lo, hi] steps in at most max_points equal widths."""
    # Per series, so that each reads its own index range (job_id, name, step) and the
    # bounds are two index probes; a bucket's point is its mean value at its last step.
    where = (Metric.job_id == job_id, Metric.name == name)
    lo = select(func.min(Metric.step)).where(*where).scalar_subquery()
    hi = select(func.max(Metric.step)).where(*where).scalar_subquery()
    width = (hi - lo + max_points) // max_points  # ceil(span / max_points)
    return (
        select(
            literal(name, String).label("name"),
            func.max(Metric.step).label("step"),
            func.avg(Metric.value).label("value"),
        )
        .where(*where)
        .group_by((Metric.step - lo) // width)
    )


def metric_names(*, session: Session, job_id: uuid.UUID) -> list[str]:
    """The names of a job's series, sorted, one index probe each (a loose index scan)."""
    first = select(func.min(Metric.name).label("name")).where(Metric.job_id == job_id)
    names = first.cte("names", recursive=True)
    following = select(func.min(Metric.name)).where(
        Metric.job_id == job_id, Metric.name > names.c.name
    )
    names = names.union_all(select(following.scalar_subquery()).where(names.c.name.is_not(None)))
    return list(session.scalars(select(names.c.name).where(names.c.name.is_not(None))))


@dataclass(frozen=True)
class TailCursor:
    """How far a live tail got: the last log line's id, the last step and its names sent."""

    # The names sent at `step` are kept because a step's points (train and test metrics)
    # can arrive in more than one write.

    event_id: int
    step: int
    sent: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Tail:
    """What is new since a cursor; `more` when a limit cut it short."""

    state: dict[str, Any] | None  # `state` of the job; None: it is gone
    lines: list[Event]
    points: list[tuple[str, int, float]]
    cursor: TailCursor
    more: bool


def latest_step(*, session: Session, job_id: uuid.UUID) -> int:
    """The last step with a metric point, or -1."""
    step = session.scalar(select(func.max(Metric.step)).where(Metric.job_id == job_id))
    return -1 if step is None else int(step)


def tail(*, session: Session, job_id: uuid.UUID, cursor: TailCursor, limit: int = 5000) -> Tail:
    """The job's state, then its log lines and metric points after `cursor`."""
    # The state is read first: when it is final, all the job wrote is in what follows.
    job = session.get(Job, job_id, populate_existing=True)
    events = session.scalars(
        select(Event)
        .where(Event.job_id == job_id, Event.id > cursor.event_id)
        .order_by(Event.id)
        .limit(limit)
    ).all()
    rows = session.execute(
        select(Metric.name, Metric.step, Metric.value)
        .where(Metric.job_id == job_id, Metric.step >= cursor.step)
        .order_by(Metric.step, Metric.name)
        .limit(limit)
    ).all()
    points = [(n, s, v) for n, s, v in rows if not (s == cursor.step and n in cursor.sent)]
    return Tail(
        state=None if job is None else state(job),
        lines=list(events),
        points=points,
        cursor=_advance(cursor, events[-1].id if events else cursor.event_id, points),
        more=len(events) == limit or len(rows) == limit,
    )


def _advance(cursor: TailCursor, event_id: int, points: list[tuple[str, int, float]]) -> TailCursor:
    if not points:
        return TailCursor(event_id, cursor.step, cursor.sent)
    step = points[-1][1]
    sent = {name for name, point_step, _ in points if point_step == step}
    if step == cursor.step:
        sent |= cursor.sent
    return TailCursor(event_id, step, frozenset(sent))
