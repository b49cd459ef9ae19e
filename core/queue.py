"""The Celery app and its reliability settings, in one place; Redis carries job ids only.

The API enqueues with `enqueue` after its transaction commits; a worker builds an app of
the same configuration (`new_app`) and adds the tasks (`worker.tasks.create_worker_app`).
Postgres stays the source of truth: a lost or duplicated message costs nothing, because a
task first claims its job in the database.
A job goes to the queue of what it needs (`core.resources`: `cpu`, `gpu`, `gpu-N`), read
from its stored spec; a worker consumes only the queues it can serve.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session

from core import resources
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings

log = logging.getLogger(__name__)

RUN_JOB = "worker.run_job"
REAP = "worker.reap_expired"
QUEUE = resources.CPU_QUEUE  # the queue of jobs a CPU may run; every worker consumes it


def new_app(settings: Settings) -> Celery:
    """A Celery app of its own, configured by `settings` (a worker's, which adds its tasks)."""
    return _configured(settings.broker_url, settings.max_job_seconds, settings.lease_seconds)


def app_for(settings: Settings) -> Celery:
    """The Celery app that sends jobs to the broker of `settings`, one per process."""
    return _sender(settings.broker_url, settings.max_job_seconds, settings.lease_seconds)


def _configured(broker_url: str, max_job_seconds: int, lease_seconds: int) -> Celery:
    """A Celery app for a broker; every reliability setting is here, with its reason."""
    app = Celery("resnet_service", broker=broker_url)
    app.conf.update(
        # A task is acknowledged only after it ran, so a worker that dies mid-job leaves
        # the message to be redelivered (the claim in the database prevents a double run).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # One job at a time per worker process, and no jobs reserved behind it.
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        # A fresh child process per job frees all GPU memory when the job ends.
        worker_max_tasks_per_child=1,
        # Redis re-delivers unacknowledged messages after this; it must exceed any job.
        broker_transport_options=_transport_options(broker_url, max_job_seconds),
        # JSON only: a message can never carry code.
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_default_queue=QUEUE,
        task_routes={RUN_JOB: {"queue": QUEUE}, REAP: {"queue": QUEUE}},
        # Hard ceiling for any job; each task also gets limits derived from its budget.
        task_time_limit=max_job_seconds + 600,
        task_soft_time_limit=max_job_seconds,
        # The reaper re-enqueues jobs whose lease expired (their worker died). Every worker
        # runs it in a thread (worker/reaper.py); this schedule serves an optional beat.
        beat_schedule={"reap-expired": {"task": REAP, "schedule": float(lease_seconds)}},
        broker_connection_retry_on_startup=True,
    )
    return app


def _transport_options(broker_url: str, max_job_seconds: int) -> dict[str, int]:
    # kombu's SQLAlchemy transport hands its options to create_engine, which rejects
    # visibility_timeout; it has no such timer (a dead worker's job comes back by the reaper).
    if broker_url.startswith("sqla+"):
        return {}
    return {"visibility_timeout": max_job_seconds + 3600}


_sender = lru_cache(maxsize=4)(_configured)


def queues_in(session: Session, job_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The queue of each job, from its stored spec (a deleted job has none)."""
    wanted = list(job_ids)
    if not wanted:
        return {}
    rows = session.execute(select(Job.id, Job.spec).where(Job.id.in_(wanted))).all()
    return {job_id: resources.queue_of(spec) for job_id, spec in rows}


def queues_of(job_ids: Iterable[uuid.UUID], *, settings: Settings) -> dict[uuid.UUID, str]:
    """The queue of each committed job, read in a session of its own."""
    with session_scope(settings.database_url) as session:
        return queues_in(session, job_ids)


def enqueue(job_id: uuid.UUID, *, settings: Settings, queue: str | None = None) -> None:
    """Put a job id on its queue (call after the job's row is committed); `queue` None: the
    queue of what its stored spec needs."""
    if queue is None:
        queue = queues_of([job_id], settings=settings).get(job_id, QUEUE)
    app_for(settings).send_task(RUN_JOB, args=[str(job_id)], queue=queue)


def enqueue_committed(job_ids: Iterable[uuid.UUID], *, settings: Settings) -> None:
    """Enqueue jobs whose rows are committed; a broker or database failure is logged.

    The job stays queued in the database, and the workers' periodic re-enqueue of queued
    jobs older than a few seconds picks it up: a broker that is down loses nothing.
    """
    wanted = list(job_ids)
    try:
        found = queues_of(wanted, settings=settings)
    except Exception:  # the database is down: the re-enqueue will find them
        log.exception("jobs %s are committed but not enqueued; the re-enqueue will retry", wanted)
        return
    for job_id in wanted:
        try:
            enqueue(job_id, settings=settings, queue=found.get(job_id, QUEUE))
        except Exception:  # any broker failure: the committed job is not lost
            log.exception("job %s is committed but not enqueued; the re-enqueue will retry", job_id)


def depth(settings: Settings, *, timeout: float | None = None) -> int:
    """Messages waiting on every job queue, not counting those a worker holds (any broker)."""
    with app_for(settings).connection_for_write(connect_timeout=timeout) as connection:
        channel = connection.default_channel
        try:
            return sum(
                int(channel.queue_declare(queue=name, passive=False).message_count)
                for name in resources.ALL_QUEUES
            )
        finally:
            _close_session(channel)


def _close_session(channel: Any) -> None:
    """Give back the database connection of an embedded-broker channel.

    kombu's SQLAlchemy channel opens a session on first use and closing the channel leaves
    it open: its pooled connection comes back only when a garbage collection frees the
    channel. A process that reads the depth every few seconds (the reaper, /metrics) would
    exhaust the broker's pool of 15 between collections, and the worker would stop.
    """
    session = getattr(channel, "_session", None)  # None on every other transport
    if session is not None:
        session.close()
