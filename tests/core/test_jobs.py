"""A job's life in the database, on Postgres and SQLite: claims, fencing, upserts."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select, text, update

from core import jobs
from core.db.session import IDLE_IN_TRANSACTION_S, get_engine, session_scope
from core.db.tables import Job, Metric
from core.errors import ConflictError
from core.kinds import TrainJobSpec
from core.settings import Settings

SPEC = TrainJobSpec.model_validate({"model": {"name": "resnet20"}, "dataset": {"name": "digits"}})


def _new_job(url: str, max_attempts: int = 3) -> uuid.UUID:
    with session_scope(url) as session:
        return jobs.create(
            session=session, settings=Settings(), spec=SPEC, max_attempts=max_attempts
        ).id


def _claim(url: str, job_id: uuid.UUID, lease: int = 60) -> jobs.Claim | None:
    with session_scope(url) as session:
        return jobs.claim(
            session=session, job_id=job_id, worker="w", device="cpu", lease_seconds=lease
        )


def test_created_job_is_queued_with_its_model_facts(database_url: str) -> None:
    job_id = _new_job(database_url)
    with session_scope(database_url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert (job.status, job.model_name, job.model_family, job.depth) == (
            "queued",
            "resnet20",
            "resnet",
            20,
        )
        assert job.dataset_name == "digits"


def test_only_one_claim_wins(database_url: str) -> None:
    job_id = _new_job(database_url)
    first = _claim(database_url, job_id)
    assert first is not None
    assert (first.token, first.attempt) == (1, 1)
    assert _claim(database_url, job_id) is None


def test_expired_lease_is_taken_over_and_the_stale_worker_is_fenced(database_url: str) -> None:
    job_id = _new_job(database_url)
    stale = _claim(database_url, job_id, lease=-1)  # already expired
    assert stale is not None
    fresh = _claim(database_url, job_id)
    assert fresh is not None
    assert fresh.token == stale.token + 1
    with pytest.raises(jobs.LeaseLost), session_scope(database_url) as session:
        jobs.write_metrics(
            session=session, job_id=job_id, token=stale.token, points=[jobs.Point("x", 1, 1.0)]
        )
    with session_scope(database_url) as session:
        jobs.write_metrics(
            session=session, job_id=job_id, token=fresh.token, points=[jobs.Point("x", 1, 2.0)]
        )


def test_metrics_upsert_never_duplicates(database_url: str) -> None:
    job_id = _new_job(database_url)
    claim = _claim(database_url, job_id)
    assert claim is not None
    for value in (1.0, 5.0):
        with session_scope(database_url) as session:
            points = [jobs.Point("train/loss", step, value * step) for step in (1, 2, 3)]
            jobs.write_metrics(session=session, job_id=job_id, token=claim.token, points=points)
    with session_scope(database_url) as session:
        rows = session.execute(
            select(Metric.step, Metric.value).where(Metric.job_id == job_id).order_by(Metric.step)
        ).all()
    assert [tuple(r) for r in rows] == [(1, 5.0), (2, 10.0), (3, 15.0)]


def test_attempts_run_out(database_url: str) -> None:
    job_id = _new_job(database_url, max_attempts=1)
    assert _claim(database_url, job_id, lease=-1) is not None
    assert _claim(database_url, job_id) is None
    with session_scope(database_url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert job.status == "failed"
        assert job.error is not None
        assert "gave up after 1 attempts" in job.error


def test_cancel_queued_and_running(database_url: str) -> None:
    queued, running = _new_job(database_url), _new_job(database_url)
    claim = _claim(database_url, running)
    assert claim is not None
    with session_scope(database_url) as session:
        assert jobs.request_cancel(session=session, job_id=queued).status == "cancelled"
        jobs.request_cancel(session=session, job_id=running)
    with session_scope(database_url) as session:
        assert (
            jobs.heartbeat(session=session, job_id=running, token=claim.token, lease_seconds=60)
            is True
        )
        jobs.finish(session=session, job_id=running, token=claim.token, status="cancelled")
    with session_scope(database_url) as session:
        with pytest.raises(ConflictError, match="already cancelled"):
            jobs.request_cancel(session=session, job_id=running)
        count = session.scalar(
            select(func.count()).select_from(Job).where(Job.status == "cancelled")
        )
        assert count is not None
        assert count >= 2


def _lease_ran_out_long_ago(url: str, *job_ids: uuid.UUID) -> None:
    with session_scope(url) as session:
        session.execute(
            update(Job)
            .where(Job.id.in_(job_ids))
            .values(updated_at=func.now() - text("interval '1 hour'"))
        )


def test_a_writer_frozen_mid_transaction_holds_up_no_reaping(postgres_url: str) -> None:
    frozen, other = _new_job(postgres_url), _new_job(postgres_url)
    for job_id in (frozen, other):
        assert _claim(postgres_url, job_id, lease=-1) is not None
    _lease_ran_out_long_ago(postgres_url, frozen, other)
    with get_engine(postgres_url).connect() as writer:  # a paused worker's open transaction
        writer.execute(select(Job.id).where(Job.id == frozen).with_for_update())
        with session_scope(postgres_url) as session:
            taken = jobs.take_expired(session=session, lease_seconds=1)
        assert other in taken
        assert frozen not in taken
        # The server ends a transaction left idle this long, and its locks with it.
        timeout = writer.execute(text("SHOW idle_in_transaction_session_timeout")).scalar()
        assert timeout == f"{IDLE_IN_TRANSACTION_S}s"
        writer.rollback()
    _lease_ran_out_long_ago(postgres_url, frozen)
    with session_scope(postgres_url) as session:
        assert frozen in jobs.take_expired(session=session, lease_seconds=1)
