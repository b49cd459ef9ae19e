"""A job's read side called directly, on Postgres and SQLite: the filtered list in keyset
pages, what a row shows, downsampled curves and the live tail."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import update

from api.schemas import JobItem, JobState
from client.filters import JobFilter
from core import job_queries, jobs, keys
from core.db.session import session_scope
from core.db.tables import Job
from core.errors import InvalidError
from core.owners import ANYONE, Caller
from tests.helpers import claim, finish, new_job

ERRORS = (0.3, None, 0.1, 0.2, None, 0.1)  # best test errors: two nulls and a tie


@pytest.fixture(scope="module")
def made(database_url: str, reader: keys.Principal) -> list[uuid.UUID]:
    """Jobs named q0..q5, tagged by parity, the even ones `reader`'s, finished with ERRORS."""
    made = []
    for index, error in enumerate(ERRORS):
        tags = ["even" if index % 2 == 0 else "odd", "core-reads"]
        job_id = new_job(database_url, name=f"q{index}", tags=tags)
        summary = {} if error is None else {"best_test_error": error}
        finish(database_url, job_id, claim(database_url, job_id), **summary)
        with session_scope(database_url) as session:
            mine = reader.key_id if index % 2 == 0 else None
            session.execute(update(Job).where(Job.id == job_id).values(owner_key_id=mine))
        made.append(job_id)
    return made


def _all(url: str, filters: JobFilter, caller: Caller = ANYONE, limit: int = 2) -> list[uuid.UUID]:
    """Every id the list gives, following its cursors."""
    found: list[uuid.UUID] = []
    cursor: str | None = None
    with session_scope(url) as session:
        while True:
            rows, cursor = job_queries.list_jobs(
                session=session, filters=filters, caller=caller, limit=limit, cursor=cursor
            )
            found += [row.id for row in rows]
            if cursor is None:
                return found


def test_pages_keep_the_sort_with_nulls_last_and_ties_by_id(
    database_url: str, made: list[uuid.UUID]
) -> None:
    by_error = JobFilter(tag=["core-reads"], sort="best_test_error")
    errors = dict(zip(made, ERRORS, strict=True))
    valued = sorted((e, str(i)) for i, e in errors.items() if e is not None)
    nulls = sorted(str(i) for i, e in errors.items() if e is None)
    expected = [uuid.UUID(i) for _, i in valued] + [uuid.UUID(i) for i in nulls]
    assert _all(database_url, by_error) == expected
    descending = JobFilter(tag=["core-reads"], sort="-best_test_error")
    assert _all(database_url, descending) == [
        *(uuid.UUID(i) for _, i in reversed(valued)),
        *(uuid.UUID(i) for i in reversed(nulls)),
    ]


def test_filters_narrow_the_list(database_url: str, made: list[uuid.UUID]) -> None:
    even = JobFilter(tag=["core-reads", "even"], sort="created")
    assert _all(database_url, even) == made[0::2]
    assert _all(database_url, JobFilter(tag=["core-reads"], q="q3")) == [made[3]]
    low = JobFilter(tag=["core-reads"], filter=["best_test_error<0.25"], sort="created")
    assert _all(database_url, low) == [made[2], made[3], made[5]]


def test_the_list_keeps_to_what_the_caller_may_read(
    database_url: str, made: list[uuid.UUID], reader: keys.Principal
) -> None:
    mine = Caller(reader, own_reads_only=True)
    assert _all(database_url, JobFilter(tag=["core-reads"], sort="created"), mine) == made[0::2]
    asked = JobFilter(tag=["core-reads"], owner="me", sort="created")
    assert _all(database_url, asked, Caller(reader)) == made[0::2]


def test_a_cursor_or_filter_it_cannot_read_is_invalid_naming_the_parameter(
    database_url: str, made: list[uuid.UUID]
) -> None:
    with session_scope(database_url) as session:
        _, cursor = job_queries.list_jobs(
            session=session, filters=JobFilter(sort="created"), limit=1
        )
        assert cursor is not None
        with pytest.raises(InvalidError, match="cursor belongs to sort=created") as refused:
            job_queries.list_jobs(session=session, filters=JobFilter(), limit=1, cursor=cursor)
        assert refused.value.field == ("query", "cursor")
        with pytest.raises(InvalidError) as refused:
            job_queries.list_jobs(session=session, filters=JobFilter(filter=["x=="]), limit=1)
        assert refused.value.field == ("query", "filter")


def test_a_row_shows_what_the_api_answers(database_url: str, made: list[uuid.UUID]) -> None:
    with session_scope(database_url) as session:
        job = session.get(Job, made[2])
        assert job is not None
        shown = job_queries.fields(job)
        state = job_queries.state(job)
    assert set(shown) == set(JobItem.model_fields)
    assert shown["results"]["best_test_error"] == 0.1
    assert shown["links"]["self"] == f"/api/v1/jobs/{made[2]}"
    assert JobState.model_validate(state).status == "succeeded"


def test_curves_are_downsampled_and_the_tail_sends_only_what_is_new(database_url: str) -> None:
    job_id = new_job(database_url)
    token = claim(database_url, job_id)
    with session_scope(database_url) as session:
        points = [jobs.Point("train/loss", step, float(step)) for step in range(1, 101)]
        jobs.write_metrics(session=session, job_id=job_id, token=token, points=points)
    with session_scope(database_url) as session:
        series = job_queries.metric_series(session=session, job_id=job_id, names=[], max_points=10)
        first = job_queries.tail(
            session=session, job_id=job_id, cursor=job_queries.TailCursor(0, 95)
        )
    steps, values = series["train/loss"]
    assert len(steps) == 10
    assert steps[-1] == 100
    assert values[0] == pytest.approx(5.5)  # the mean of steps 1..10
    assert [step for _, step, _ in first.points] == [95, 96, 97, 98, 99, 100]
    assert first.state is not None
    assert first.state["status"] == "running"
    with session_scope(database_url) as session:
        jobs.write_metrics(
            session=session, job_id=job_id, token=token, points=[jobs.Point("x", 101, 1.0)]
        )
        jobs.add_event(session=session, job_id=job_id, level="info", message="started")
    with session_scope(database_url) as session:
        new = job_queries.tail(session=session, job_id=job_id, cursor=first.cursor)
        again = job_queries.tail(session=session, job_id=job_id, cursor=new.cursor)
    assert [line.message for line in new.lines] == ["started"]
    assert new.points == [("x", 101, 1.0)]
    assert (again.points, again.lines, again.more) == ([], [], False)
