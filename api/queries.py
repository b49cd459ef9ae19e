"""Read-side queries: the job list (keyset pages), downsampled curves, a job's live tail.

Portable between Postgres and SQLite; the tag filter and JSON paths differ by dialect.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    String,
    and_,
    cast,
    exists,
    func,
    literal,
    or_,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session, defer

from api import search
from api.schemas import JobState, LogLine
from core.db.tables import Event, Job, Metric
from core.errors import InvalidError


@dataclass(frozen=True)
class JobFilter:
    """What the job list is narrowed to; None (or empty) means any."""

    statuses: Sequence[str] = ()
    kind: str | None = None
    model: str | None = None
    family: str | None = None
    dataset: str | None = None
    tags: Sequence[str] = ()  # every one of them
    q: str | None = None
    study: uuid.UUID | None = None
    owner: uuid.UUID | None = None  # only this API key's jobs
    where: Sequence[search.Condition] = ()  # filter expressions, all of them


def list_jobs(
    *,
    session: Session,
    filters: JobFilter,
    sort: str,
    limit: int,
    cursor: str | None,
    documents: bool = False,
) -> tuple[list[Job], str | None]:
    """One page of jobs after `cursor`, and the cursor of the next page (None at the end).

    `sort` is a sort key of `api.search` (nulls last, ties by id); `documents` loads each
    job's summary too."""
    key = search.parse_sort(sort)
    dialect = session.get_bind().dialect.name
    column = search.sort_expression(key.field, dialect)
    nullable = key.field.column != "created_at"
    query = select(Job, column.label("sort_key"))
    if not documents:
        # The runs table reads the spec (a job's queue and needs), never the whole summary;
        # a deferred spec would cost each row a query of its own.
        query = query.options(defer(Job.summary), defer(Job.data), defer(Job.environment))
    query = query.where(*_conditions(filters, dialect))
    if cursor is not None:
        value, after_id = decode_cursor(cursor, key)
        query = query.where(_after(column, key.descending, value, after_id, nullable=nullable))
    order = column.desc() if key.descending else column.asc()
    if nullable:
        order = order.nulls_last()
    query = query.order_by(order, Job.id.desc() if key.descending else Job.id.asc())
    rows = session.execute(query.limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if more else None
    return [row[0] for row in rows], None if last is None else encode_cursor(sort, *last)


def _conditions(filters: JobFilter, dialect: str) -> list[ColumnElement[bool]]:
    """The WHERE clauses of `filters`."""
    conditions: list[ColumnElement[bool]] = []
    if filters.statuses:
        conditions.append(Job.status.in_(filters.statuses))
    equal = {
        Job.kind: filters.kind,
        Job.model_name: filters.model,
        Job.model_family: filters.family,
        Job.dataset_name: filters.dataset,
        Job.study_id: filters.study,
        Job.owner_key_id: filters.owner,
    }
    conditions += [column == value for column, value in equal.items() if value is not None]
    conditions += [_has_tag(tag, dialect) for tag in filters.tags]
    if filters.q:
        conditions.append(Job.name.ilike(f"%{search.escape_like(filters.q)}%", escape="\\"))
    conditions += [search.condition(where, dialect) for where in filters.where]
    return conditions


def _has_tag(tag: str, dialect: str) -> ColumnElement[bool]:
    """Whether the job's JSON list of tags holds `tag`."""
    if dialect == "postgresql":
        return cast(Job.tags, JSONB).contains([tag])
    each = func.json_each(Job.tags).table_valued("value")
    return exists(select(1).select_from(each).where(each.c.value == tag))


def _after(
    column: ColumnElement[Any],
    descending: bool,
    value: Any,
    after_id: uuid.UUID,
    *,
    nullable: bool,
) -> ColumnElement[bool]:
    """Rows after (value, id) in the order of `column` (nulls last), then id."""
    if value is None:  # already among the trailing nulls
        return and_(column.is_(None), Job.id < after_id if descending else Job.id > after_id)
    key, cursor_key = tuple_(column, Job.id), (value, after_id)
    beyond = key < cursor_key if descending else key > cursor_key
    return or_(beyond, column.is_(None)) if nullable else beyond


def encode_cursor(sort: str, job: Job, value: Any) -> str:
    """An opaque cursor: the sort and the sort key and id of the last row of a page."""
    if isinstance(value, datetime):
        value = value.isoformat()
    raw = json.dumps([sort, value, str(job.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, key: search.SortKey) -> tuple[Any, uuid.UUID]:
    """The (sort key, id) of a cursor; `InvalidError` when it is not one of `key`'s."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        parts = json.loads(raw)
    except (binascii.Error, ValueError) as error:
        raise _bad_cursor("it is not base64 of JSON") from error
    if not isinstance(parts, list) or len(parts) != 3:
        raise _bad_cursor("it is not a [sort, value, id] list")
    cursor_sort, value, job_id = parts
    if cursor_sort != key.name:
        raise InvalidError(
            f"cursor belongs to sort={cursor_sort}, not sort={key.name}",
            field=("query", "cursor"),
        )
    return _cursor_value(value, key.field), _cursor_id(job_id)


def _cursor_id(job_id: Any) -> uuid.UUID:
    """The job id of a cursor: a UUID in its string form."""
    if isinstance(job_id, str):
        try:
            return uuid.UUID(job_id)
        except ValueError:
            pass
    raise _bad_cursor("its id is not a job id")


def _cursor_value(value: Any, field: search.Field) -> Any:
    """The sort key of a cursor: an ISO time for the times, a number otherwise, or null."""
    if value is None:
        if field.column == "created_at":
            raise _bad_cursor(f"its {field.name} value is null")
        return None
    if field.is_time:
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                pass
        raise _bad_cursor(f"its {field.name} value is not an ISO time")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad_cursor(f"its {field.name} value is not a number")
    try:
        return float(value)
    except OverflowError:
        raise _bad_cursor(f"its {field.name} value is out of range") from None


def _bad_cursor(why: str) -> InvalidError:
    return InvalidError(
        f"cursor is not one this API gave out ({why}); pass a page's next_cursor as it came, "
        "or leave cursor out for the first page",
        field=("query", "cursor"),
    )


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

    state: JobState | None
    lines: list[LogLine]
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
    state = None if job is None else JobState.of(job)
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
        state=state,
        lines=[LogLine.of(event) for event in events],
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
