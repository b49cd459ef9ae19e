"""A study run by real workers on Postgres and Redis: never more than max_parallel at once."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import select

from core import queue
from core.db.session import session_scope
from core.db.tables import Job
from core.studies import results
from core.studies import service as studies
from tests.helpers import recipe, wait_for
from tests.services import Service

pytestmark = pytest.mark.slow


def test_a_study_runs_one_job_at_a_time_to_its_results(service: Service) -> None:
    settings, url = service.settings, service.url
    request = studies.Request(
        base={"model": {"name": "resnet8"}, "dataset": {"name": "digits"}, "recipe": recipe(1)},
        grid={"model.name": ["plain8", "resnet8"]},
        seeds=[0, 1],
        name="plain or residual",
        max_parallel=1,
    )
    with session_scope(url) as session:
        study = studies.create(
            session=session, settings=settings, request=request, max_jobs=10, max_attempts=3
        )
        study_id = study.id
        released = studies.release(session=session, settings=settings, study_id=study_id)
    assert len(released) == 1
    for job_id in released:
        queue.enqueue(job_id, settings=settings)

    def finished() -> list[Job] | None:
        with session_scope(url) as session:
            rows = list(session.scalars(select(Job).where(Job.study_id == study_id)))
        return rows if all(row.status == "succeeded" for row in rows) else None

    rows = wait_for(finished, 240, "every job of the study to succeed")
    spans = sorted((row.started_at, row.finished_at) for row in rows)
    for (_, ended), (started, _) in itertools.pairwise(spans):
        assert ended is not None
        assert started is not None
        assert started >= ended  # the next one started only after the one before ended
    with session_scope(url) as session:
        found = studies.get(session=session, study_id=study_id)
        assert studies.state(found, studies.counts(session=session, study_id=study_id)) == (
            "succeeded"
        )
        cells = results.cells(session=session, study=found)
    assert [cell["seeds_done"] for cell in cells] == [[0, 1], [0, 1]]
    for cell in cells:
        assert cell["final_train_error"]["median"] is not None
        assert cell["final_test_error"]["min"] <= cell["final_test_error"]["max"]
