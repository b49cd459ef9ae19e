"""Real workers on real Postgres and Redis: train, evaluate, cancel, kill -9, redeliver, give up.

Two `resnet-service worker` processes serve the module; jobs are submitted as the API does
(commit, then enqueue) and the database is polled with deadlines.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from sqlalchemy import select, update

from core import jobs
from core.db.session import session_scope
from core.db.tables import Job, Metric, utcnow
from core.kinds import EvaluateJobSpec
from tests.helpers import (
    LOG_EVERY,
    checkpoint_rows,
    job,
    job_pid,
    messages,
    metric_counts,
    metric_steps,
    submit,
    train_spec,
    wait_for,
    wait_status,
)
from tests.services import LEASE_SECONDS, Service
from training.checkpoints import sha256_of

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 22


def test_train_job_writes_everything_then_evaluate_reads_its_best_checkpoint(
    service: Service,
) -> None:
    url = service.url
    train_id = submit(service.settings, train_spec(epochs=4))
    done = wait_status(url, train_id, "succeeded")

    total = 4 * STEPS_PER_EPOCH
    assert (done.attempt, done.step, done.total_steps) == (1, total, total)
    assert done.final_test_error is not None
    assert done.final_test_error < 0.2
    assert (done.params, done.macs) == (75_002, 747_136)
    assert done.wall_time_s
    assert done.images_per_s
    assert done.summary is not None
    assert done.summary["steps"] == total
    # What it read and ran on: on its row (the list filters by the digest) and its summary.
    assert done.data_digest is not None
    assert done.data_digest.startswith("sha256:")
    assert done.data is not None
    assert done.data["digest"] == done.summary["data"]["digest"] == done.data_digest
    assert done.data["splits"]["train"] > 0
    assert len(done.data["classes"]) == 10
    assert done.environment is not None
    assert done.environment["torch"] == torch.__version__
    assert done.environment["device_type"] == "cpu"
    assert done.summary["environment"]["torch"] == torch.__version__
    assert metric_steps(url, train_id, "train/loss") == list(range(LOG_EVERY, total + 1, LOG_EVERY))
    assert metric_steps(url, train_id, "test/error") == [22, 44, 66, 88]
    rows, distinct = metric_counts(url, train_id)
    assert rows == distinct
    log = messages(url, train_id)
    assert log[:3] == ["queued", log[1], "training resnet8 on digits for 88 steps"]
    assert log[1].startswith("attempt 1 on w")
    assert log[-2:] == ["finished", "succeeded"]

    saved = checkpoint_rows(url, train_id)
    assert [row.is_best for row in saved].count(True) == 1
    for row in saved:
        assert sha256_of(Path(row.path)) == row.sha256
    best = next(row for row in saved if row.is_best)
    assert best.path.endswith("best.pt")

    spec = EvaluateJobSpec.model_validate(
        {
            "kind": "evaluate",
            "source_job": str(train_id),
            "checkpoint": "best",
            "dataset": {"name": "digits", "validation": 0},
        }
    )
    evaluation = wait_status(url, submit(service.settings, spec), "succeeded")
    summary = evaluation.summary
    assert summary is not None
    assert summary["checkpoint"]["sha256"] == best.sha256
    # The same net on the same test split as the training run's evaluation at that step.
    test_error_then = _metric(url, train_id, "test/error", best.step)
    assert summary["error"] == pytest.approx(test_error_then, abs=1e-9)
    assert evaluation.final_test_error == pytest.approx(test_error_then, abs=1e-9)
    confusion = summary["confusion"]
    assert len(confusion) == 10
    assert sum(map(sum, confusion)) == summary["count"] == 359
    assert len(summary["per_class_accuracy"]) == 10
    assert 0 <= summary["ece"] < 1
    assert metric_steps(url, evaluation.id, "test/error") == [best.step]
    # The same files, split otherwise: the same digest, on the evaluation's row too.
    assert evaluation.data_digest == done.data_digest
    assert evaluation.environment is not None


def test_cancel_reaches_a_running_job_and_frees_its_worker(service: Service) -> None:
    url = service.url
    long_jobs = [submit(service.settings, train_spec(epochs=1000)) for _ in range(2)]
    wait_for(lambda: all(job(url, i).step > 0 for i in long_jobs), 60, "both long jobs to run")
    # A running job's row names its data already: a digest filter finds it while it runs.
    assert all((job(url, i).data_digest or "").startswith("sha256:") for i in long_jobs)
    waiting = submit(service.settings, train_spec(epochs=2))
    assert job(url, waiting).status == "queued"  # both workers are busy

    cancelled = long_jobs[0]
    with session_scope(url) as session:
        jobs.request_cancel(session=session, job_id=cancelled)
    asked = time.monotonic()
    row = wait_status(url, cancelled, "cancelled", timeout=10)
    assert time.monotonic() - asked < 10
    assert row.summary is not None
    assert row.summary["stopped"] is True
    assert messages(url, cancelled)[-3:] == ["cancel requested", "stopped on request", "cancelled"]

    # The freed worker takes the waiting job while the other still trains.
    next_job = wait_status(url, waiting, "succeeded", timeout=60)
    assert next_job.worker is not None
    assert row.worker is not None
    assert next_job.worker.split(" pid ")[0] == row.worker.split(" pid ")[0]
    assert job(url, long_jobs[1]).status == "running"
    with session_scope(url) as session:
        jobs.request_cancel(session=session, job_id=long_jobs[1])
    wait_status(url, long_jobs[1], "cancelled", timeout=10)


def test_two_deliveries_of_one_job_run_it_once(service: Service) -> None:
    url = service.url
    job_id = submit(service.settings, train_spec(epochs=2), deliveries=2)
    done = wait_status(url, job_id, "succeeded")
    wait_for(lambda: f"job {job_id}: not claimable" in service.logs(), 30, "the second delivery")
    assert done.attempt == 1
    attempts = [m for m in messages(url, job_id) if m.startswith("attempt ")]
    assert len(attempts) == 1
    assert attempts[0].startswith("attempt 1 on ")
    rows, distinct = metric_counts(url, job_id)
    assert rows == distinct
    assert metric_steps(url, job_id, "train/loss") == [11, 22, 33, 44]


def test_kill_9_of_the_job_process_resumes_from_the_last_checkpoint(service: Service) -> None:
    url = service.url
    job_id = submit(service.settings, train_spec(epochs=30))
    wait_for(lambda: checkpoint_rows(url, job_id), 60, "a first checkpoint")
    victim = job(url, job_id)
    os.kill(job_pid(victim), signal.SIGKILL)

    done = wait_status(url, job_id, "succeeded", timeout=90)
    _assert_resumed_on_one_axis(url, done, epochs=30)


def test_kill_9_of_a_whole_worker_resumes_on_another(service: Service) -> None:
    url = service.url
    job_id = submit(service.settings, train_spec(epochs=30))
    wait_for(lambda: checkpoint_rows(url, job_id), 60, "a first checkpoint")
    victim = job(url, job_id)
    assert victim.worker is not None
    node = victim.worker.split("@")[0]
    service.workers[node].kill_all()

    done = wait_status(url, job_id, "succeeded", timeout=90)
    _assert_resumed_on_one_axis(url, done, epochs=30)
    assert done.worker is not None
    assert not done.worker.startswith(f"{node}@")
    service.start(node)  # the module's later tests get two workers again


def test_a_worker_that_lost_its_lease_stops_without_writing(service: Service) -> None:
    url = service.url
    job_id = submit(service.settings, train_spec(epochs=1000))
    wait_for(lambda: job(url, job_id).step > 0, 60, "the job to run")
    # Another delivery takes the job over (as after a network partition): in one
    # transaction, so the worker's heartbeat cannot renew the lease in between.
    with session_scope(url) as session:
        session.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow()))
        thief = jobs.claim(
            session=session, job_id=job_id, worker="thief", device="cpu", lease_seconds=600
        )
        assert thief is not None

    wait_for(lambda: f"job {job_id}: lease lost" in service.logs(), 15, "the worker to stop")
    row = job(url, job_id)
    assert (row.status, row.worker, row.attempt) == ("running", "thief", 2)
    assert messages(url, job_id)[-1] == "attempt 2 on thief (cpu)"
    with session_scope(url) as session:
        jobs.finish(session=session, job_id=job_id, token=thief.token, status="cancelled")


def test_a_job_whose_lease_keeps_expiring_gives_up(service: Service) -> None:
    url = service.url
    with session_scope(url) as session:
        job_id = jobs.create(
            session=session, settings=service.settings, spec=train_spec(epochs=1), max_attempts=1
        ).id
    # Attempt 1 by a worker that dies at once: its lease is already over.
    with session_scope(url) as session:
        claim = jobs.claim(
            session=session, job_id=job_id, worker="ghost", device="cpu", lease_seconds=-1
        )
        assert claim is not None
    _age(url, job_id, seconds=2 * LEASE_SECONDS)

    failed = wait_status(url, job_id, "failed", timeout=30)
    assert failed.error == "gave up after 1 attempts (workers died or lost their lease)"
    assert "lease expired (worker died or hung): re-enqueued" in messages(url, job_id)


def test_a_queued_job_whose_message_was_lost_is_re_enqueued(service: Service) -> None:
    url = service.url
    with session_scope(url) as session:
        job_id = jobs.create(
            session=session, settings=service.settings, spec=train_spec(epochs=1), max_attempts=3
        ).id
    _age(url, job_id, seconds=3 * LEASE_SECONDS)  # committed long ago, never enqueued

    done = wait_status(url, job_id, "succeeded", timeout=30)
    assert done.attempt == 1
    assert any("message lost?" in m for m in messages(url, job_id))


def test_a_cancelled_job_whose_worker_died_ends_cancelled(service: Service) -> None:
    url = service.url
    with session_scope(url) as session:
        job_id = jobs.create(
            session=session, settings=service.settings, spec=train_spec(epochs=1), max_attempts=3
        ).id
    with session_scope(url) as session:
        jobs.claim(session=session, job_id=job_id, worker="ghost", device="cpu", lease_seconds=-1)
        jobs.request_cancel(session=session, job_id=job_id)

    wait_status(url, job_id, "cancelled", timeout=30)
    assert messages(url, job_id)[-1] == "cancelled (its worker had stopped)"


def _assert_resumed_on_one_axis(url: str, done: Job, *, epochs: int) -> None:
    """Attempt 2 resumed from a checkpoint; every series is whole, with no duplicate."""
    total = epochs * STEPS_PER_EPOCH
    assert done.attempt == 2
    assert (done.step, done.total_steps) == (total, total)
    resumed = [m for m in messages(url, done.id) if m.startswith("resumed from step-")]
    assert len(resumed) == 1, messages(url, done.id)
    assert metric_steps(url, done.id, "train/loss") == list(range(LOG_EVERY, total + 1, LOG_EVERY))
    assert metric_steps(url, done.id, "test/error") == list(
        range(STEPS_PER_EPOCH, total + 1, STEPS_PER_EPOCH)
    )
    rows, distinct = metric_counts(url, done.id)
    assert rows == distinct
    for row in checkpoint_rows(url, done.id):
        assert sha256_of(Path(row.path)) == row.sha256


def _metric(url: str, job_id: uuid.UUID, name: str, step: int) -> float:
    with session_scope(url) as session:
        value = session.scalar(
            select(Metric.value).where(
                Metric.job_id == job_id, Metric.name == name, Metric.step == step
            )
        )
    assert value is not None
    return float(value)


def _age(url: str, job_id: uuid.UUID, *, seconds: float) -> None:
    """Make a job look untouched for `seconds` (as if it waited that long)."""
    past = utcnow() - timedelta(seconds=seconds)
    with session_scope(url) as session:
        session.execute(
            update(Job).where(Job.id == job_id).values(updated_at=past, created_at=past)
        )
