"""A search's trial in the worker: its pruner stops it at an evaluation (status pruned, its
checkpoint kept, the worker free and the next trial asked for); retried, it runs to its end."""

from __future__ import annotations

import uuid

import redis
from sqlalchemy import func, select

from core import jobs
from core.db.session import session_scope
from core.db.tables import Checkpoint, Event, Job
from core.settings import Settings
from core.studies import search, service
from tests.helpers import job, queued_ids, tiny_synthetic
from worker import runner

BASE = tiny_synthetic()
SPACE = {"recipe.lr": {"type": "loguniform", "low": 0.01, "high": 0.1}}


def _search(settings: Settings) -> list[uuid.UUID]:
    """A median-pruned search whose first trial ended perfect at every evaluation; the
    second trial's job, asked for once the first ended."""
    found = search.Search(method="random", space=SPACE, trials=3, pruner="median", startup_trials=1)
    request = service.Request(base=BASE, grid={}, seeds=[0], max_parallel=1, search=found)
    url = settings.database_url
    with session_scope(url) as session:
        study = service.create(
            session=session, settings=settings, request=request, max_jobs=10, max_attempts=3
        )
        (first,) = service.release(session=session, settings=settings, study_id=study.id)
    with session_scope(url) as session:
        claimed = jobs.claim(
            session=session, job_id=first, worker="w", device="cpu", lease_seconds=60
        )
        assert claimed is not None
        perfect = [jobs.Point("val/error", step, 0.0) for step in range(4, 41, 4)]
        jobs.write_metrics(session=session, job_id=first, token=claimed.token, points=perfect)
        jobs.finish(session=session, job_id=first, token=claimed.token, status="succeeded")
    with session_scope(url) as session:
        return service.release_after(session=session, settings=settings, job_id=first)


def test_a_pruned_trial_stops_at_its_first_evaluation_and_the_next_is_asked(
    settings: Settings, queue: redis.Redis
) -> None:
    (second,) = _search(settings)
    runner.execute(second, settings=settings, worker="w")
    row = job(settings.database_url, second)
    assert (row.status, row.error, row.step) == ("pruned", None, 4)
    assert row.summary is not None
    ended = row.summary["ended"]
    assert (ended["reason"], ended["step"]) == ("pruned", 4)
    assert ended["message"].startswith("pruned by the median pruner at step 4: val/error ")
    with session_scope(settings.database_url) as session:
        kept = session.scalar(
            select(func.count()).select_from(Checkpoint).where(Checkpoint.job_id == second)
        )
        assert kept
        logged = list(session.scalars(select(Event.message).where(Event.job_id == second)))
        assert ended["message"] in logged
        third = session.scalars(
            select(Job.id).where(Job.study_id == row.study_id, Job.cell == 2)
        ).one()
    assert str(third) in queued_ids(queue)  # its worker's room went to the next trial

    with session_scope(settings.database_url) as session:
        retried = jobs.retry(session=session, settings=settings, job_id=second)
        assert retried.resume_step == 4
    runner.execute(second, settings=settings, worker="w")
    row = job(settings.database_url, second)
    assert (row.status, row.step) == ("succeeded", 40)  # not judged again
