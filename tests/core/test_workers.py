"""The workers' register: register, heartbeat, current job, jobs done, alive or lost."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from core import jobs, workers
from core.db.session import session_scope
from core.db.tables import Worker, utcnow
from core.kinds import TrainJobSpec
from core.settings import Settings

LEASE = 10
DIGITS = {"name": "digits"}


def _seen(url: str) -> dict[str, workers.Seen]:
    with session_scope(url) as session:
        return {s.worker.name: s for s in workers.listing(session=session, lease_seconds=LEASE)}


def test_a_worker_registers_beats_runs_a_job_and_turns_lost_unseen(database_url: str) -> None:
    spec = TrainJobSpec.model_validate({"model": {"name": "resnet8"}, "dataset": DIGITS})
    with session_scope(database_url) as session:
        job_id = jobs.create(
            session=session, settings=Settings(database_url=database_url), spec=spec, max_attempts=3
        ).id
        for name in ("a@h", "b@h"):
            workers.register(session=session, name=name, host="h", pid=1, devices=["cpu"],
                             queues=["train"])  # fmt: skip
    with session_scope(database_url) as session:
        workers.running(session=session, name="a@h", job_id=job_id)
        assert workers.serving(session=session, queue="train", lease_seconds=LEASE) == 2
        assert workers.serving(session=session, queue="gpu", lease_seconds=LEASE) == 0
    seen = _seen(database_url)
    assert (seen["a@h"].state, seen["a@h"].worker.current_job_id) == ("alive", job_id)

    with session_scope(database_url) as session:
        workers.finished(session=session, name="a@h")
        stale = utcnow() - timedelta(seconds=3 * LEASE + 1)
        session.execute(update(Worker).where(Worker.name == "b@h").values(last_seen_at=stale))
    seen = _seen(database_url)
    assert (seen["a@h"].worker.current_job_id, seen["a@h"].worker.jobs_done) == (None, 1)
    assert seen["b@h"].state == "lost"

    with session_scope(database_url) as session:
        workers.heartbeat(session=session, name="b@h")
        # A restart under the same name takes over the row, its count from zero.
        workers.register(session=session, name="a@h", host="h2", pid=2, devices=["cuda:0"],
                         queues=["train", "gpu"])  # fmt: skip
    seen = _seen(database_url)
    assert seen["b@h"].state == "alive"
    assert (seen["a@h"].worker.host, seen["a@h"].worker.jobs_done) == ("h2", 0)
    assert seen["a@h"].worker.queues == ["train", "gpu"]

    with session_scope(database_url) as session:
        workers.deregister(session=session, name="a@h")
        gone = utcnow() - workers.FORGET_AFTER - timedelta(seconds=1)
        session.execute(update(Worker).where(Worker.name == "b@h").values(last_seen_at=gone))
        assert workers.forget_lost(session=session, unseen_for=workers.FORGET_AFTER) == 1
        jobs.delete(session=session, job_id=job_id)
    assert _seen(database_url) == {}
