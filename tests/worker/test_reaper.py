"""The reaper called directly on Postgres and Redis: jobs whose worker died or whose message
was lost (on no queue a worker reads, or on none at all) go back on the queue, once, with a
line in their log; a broker that is down skips the pass; the thread passes until stopped."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
import redis
from sqlalchemy import update

from core import jobs
from core import queue as job_queue
from core.db.session import session_scope
from core.db.tables import Job, utcnow
from core.kinds import TrainJobSpec
from core.settings import Settings
from tests.helpers import claim, job, messages, new_job, queued_ids, wait_for
from worker import reaper

DIGITS = {"model": {"name": "resnet8"}, "dataset": {"name": "digits"}, "recipe": {"epochs": 1}}
OLD_CPU_QUEUE = "train"  # what the `cpu` queue was called before
HOUR = timedelta(hours=1)


def test_a_job_left_on_the_old_train_queue_is_enqueued_again_on_cpu(
    settings: Settings, queue: redis.Redis
) -> None:
    with session_scope(settings.database_url) as session:
        spec = TrainJobSpec.model_validate(DIGITS)
        job_id = jobs.create(session=session, settings=settings, spec=spec, max_attempts=3).id
    job_queue.enqueue(job_id, settings=settings, queue=OLD_CPU_QUEUE)  # as an older release
    assert reaper.reap_once(settings) == []  # just queued: its message may still come
    untouched = reaper.MESSAGE_LOST_AFTER_LEASES * settings.lease_seconds + 1
    with session_scope(settings.database_url) as session:
        old = utcnow() - timedelta(seconds=untouched)
        session.execute(update(Job).where(Job.id == job_id).values(updated_at=old))
    try:
        assert reaper.reap_once(settings) == [job_id]
        assert (queue.llen(job_queue.QUEUE), queue.llen(OLD_CPU_QUEUE)) == (1, 1)
        assert reaper.reap_once(settings) == []  # its new message counts as waiting
    finally:
        queue.delete(OLD_CPU_QUEUE)


def _age(url: str, job_id: uuid.UUID, **values: object) -> None:
    """Move a job's row back in time (an hour untouched, unless `values` say otherwise)."""
    with session_scope(url) as session:
        changed = {"updated_at": utcnow() - HOUR, **values}
        session.execute(update(Job).where(Job.id == job_id).values(**changed))


@pytest.fixture(autouse=True)
def quiet(settings: Settings, queue: redis.Redis) -> redis.Redis:
    """No job of an earlier test is left waiting or running; the queues are empty."""
    with session_scope(settings.database_url) as session:
        session.execute(
            update(Job).where(Job.status.in_(("queued", "running"))).values(status="cancelled")
        )
    return queue


def test_a_job_whose_lease_expired_is_enqueued_again_once(
    settings: Settings, quiet: redis.Redis
) -> None:
    url = settings.database_url
    job_id = new_job(url)
    claim(url, job_id)
    _age(url, job_id, lease_expires_at=utcnow() - HOUR)

    assert reaper.reap_once(settings) == [job_id]
    assert queued_ids(quiet) == [str(job_id)]
    assert "lease expired (worker died or hung): re-enqueued" in messages(url, job_id)
    assert job(url, job_id).status == "running"  # the next claim takes it over
    assert reaper.reap_once(settings) == []  # taken: not again within the lease


def test_a_running_job_within_its_lease_is_left_alone(
    settings: Settings, quiet: redis.Redis
) -> None:
    url = settings.database_url
    job_id = new_job(url)
    claim(url, job_id)
    _age(url, job_id)  # untouched for an hour, but its lease (60 s from the claim) holds

    assert reaper.reap_once(settings) == []
    assert queued_ids(quiet) == []


def test_a_queued_job_beyond_the_waiting_messages_is_enqueued_again(
    settings: Settings, quiet: redis.Redis
) -> None:
    url = settings.database_url
    waiting, lost = new_job(url), new_job(url)
    job_queue.enqueue(waiting, settings=settings)  # one message on the broker, for the older job
    _age(url, waiting, created_at=utcnow() - 2 * HOUR)
    _age(url, lost)

    assert reaper.reap_once(settings) == [waiting]  # the oldest of the queued: one was lost
    assert sorted(queued_ids(quiet)) == sorted([str(waiting), str(waiting)])
    note = "no worker took it in time (message lost?): re-enqueued"
    assert note in messages(url, waiting)
    assert note not in messages(url, lost)


def test_a_queued_job_with_its_message_waiting_is_left_alone(
    settings: Settings, quiet: redis.Redis
) -> None:
    url = settings.database_url
    job_id = new_job(url)
    job_queue.enqueue(job_id, settings=settings)
    _age(url, job_id)

    assert reaper.reap_once(settings) == []
    assert queued_ids(quiet) == [str(job_id)]


def test_an_abandoned_cancel_ends_the_job_cancelled(settings: Settings) -> None:
    url = settings.database_url
    job_id = new_job(url)
    claim(url, job_id)
    _age(url, job_id, cancel_requested=True, lease_expires_at=utcnow() - HOUR)

    assert reaper.reap_once(settings) == []  # nothing to enqueue
    assert job(url, job_id).status == "cancelled"
    assert "cancelled (its worker had stopped)" in messages(url, job_id)


def test_a_pass_with_the_broker_down_takes_nothing(settings: Settings) -> None:
    url = settings.database_url
    job_id = new_job(url)
    claim(url, job_id)
    _age(url, job_id, lease_expires_at=utcnow() - HOUR)
    down = settings.model_copy(
        update={"broker_url": "redis://127.0.0.1:1/0", "probe_timeout_seconds": 0.5}
    )

    assert reaper.reap_once(down) == []
    assert reaper.reap_once(settings) == [job_id]  # still there for the next pass


def test_a_pass_is_a_third_of_the_lease_and_at_least_a_second(settings: Settings) -> None:
    assert reaper.interval(settings.model_copy(update={"lease_seconds": 60})) == 20
    assert reaper.interval(settings.model_copy(update={"lease_seconds": 2})) == 1


def test_the_thread_beats_and_reaps_until_stopped(settings: Settings) -> None:
    url = settings.database_url
    job_id = new_job(url)
    claim(url, job_id)
    _age(url, job_id, lease_expires_at=utcnow() - HOUR)
    beats = threading.Event()
    thread = reaper.Reaper(settings)
    thread.beat = beats.set
    thread.start()
    note = "lease expired (worker died or hung): re-enqueued"
    try:
        wait_for(lambda: note in messages(url, job_id), 30, "the reaper's first pass")
    finally:
        thread.stop()
    assert beats.is_set()  # before the pass
    assert not thread.is_alive()
