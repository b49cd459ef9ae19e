"""Faults with real workers on Postgres and Redis: nothing lost, nothing run twice.

A database that cuts every connection for a while delays a job, never fails it; a worker
paused past its lease (SIGSTOP) writes nothing once resumed; SIGTERM hands a job back to
another worker at once (last: it leaves the module one worker).
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from contextlib import suppress
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from core.db.tables import Job
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
from tests.services import LEASE_SECONDS, POSTGRES_ADMIN_URL, Service
from training.checkpoints import sha256_of

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 22
EPOCHS = 8


def test_a_database_outage_delays_a_job_and_never_fails_it(service: Service) -> None:
    url = service.url
    job_id = submit(service.settings, train_spec(epochs=EPOCHS))
    wait_for(lambda: checkpoint_rows(url, job_id), 300, "a first checkpoint")

    # Shorter than the lease: the writes are retried and the same attempt goes on.
    assert _cut_connections(url, seconds=3.0) > 0
    assert job(url, job_id).attempt == 1
    wait_for(lambda: job(url, job_id).step > 0, 60, "the job to report again")
    # Longer than the lease: the attempt stops, and the job resumes once the database is back.
    _refuse_connections(url, seconds=LEASE_SECONDS + 4.0)

    done = wait_status(url, job_id, "succeeded", timeout=300)
    # Attempt 2 resumed it, unless the first renewed its lease before a reaper took it.
    assert done.attempt <= 2
    log = messages(url, job_id)
    assert not [m for m in log if "failed" in m or m.startswith("Traceback")], log
    _assert_one_axis(url, done, epochs=EPOCHS)


def test_a_worker_paused_past_its_lease_writes_nothing_once_resumed(service: Service) -> None:
    url = service.url
    spec = train_spec(epochs=3)
    spec = spec.model_copy(
        update={"recipe": spec.recipe.model_copy(update={"checkpoint_every": 1})}
    )
    job_id = submit(service.settings, spec, max_attempts=6)
    wait_for(lambda: checkpoint_rows(url, job_id), 300, "a first checkpoint")
    paused = job(url, job_id)
    node = _node(paused)
    os.kill(job_pid(paused), signal.SIGSTOP)
    try:
        wait_for(
            lambda: (row := job(url, job_id)).attempt >= 2 and row.status == "running",
            120,
            "another worker to take the job over",
        )
        # The new owner checkpoints (unless the paused one froze holding the folder's lock).
        with suppress(AssertionError):
            wait_for(lambda: job(url, job_id).step > paused.step + 2, 60, "new checkpoints")
    finally:
        os.kill(job_pid(paused), signal.SIGCONT)

    resumed = service.workers[node]
    try:
        # Its lease is found lost: by a fenced write, or by its closed connection found dead
        # past the lease.
        wait_for(lambda: f"job {job_id}: lease lost" in resumed.output(), 240, "the worker to stop")
    except AssertionError as error:
        raise AssertionError(f"{error}; its log ends:\n{resumed.output()[-4000:]}") from None
    done = wait_status(url, job_id, "succeeded", timeout=300)
    assert done.attempt >= 2
    _assert_one_axis(url, done, epochs=3)
    folder = Path(checkpoint_rows(url, job_id)[0].path).parent
    assert (folder / ".fence").read_text() == f"{_token(url, job_id)}\n"
    best = next(row for row in checkpoint_rows(url, job_id) if row.is_best)
    assert sha256_of(folder / "best.pt") == best.sha256


def test_sigterm_hands_the_job_back_and_another_worker_resumes_it_at_once(
    service: Service,
) -> None:
    url = service.url
    job_id = submit(service.settings, train_spec(epochs=EPOCHS))
    wait_for(lambda: checkpoint_rows(url, job_id), 300, "a first checkpoint")
    victim = job(url, job_id)
    node = _node(victim)
    stopping = service.workers[node]

    stopping.process.send_signal(signal.SIGTERM)  # what `docker compose stop` sends
    asked = time.monotonic()
    resumed = wait_for(lambda: _running_elsewhere(url, job_id, node), 30, "another worker")
    took = time.monotonic() - asked
    assert took < LEASE_SECONDS, (took, messages(url, job_id))  # at once, not at lease expiry
    assert stopping.process.wait(timeout=30) == 0  # a warm shutdown, after the hand-back
    # The module's last test: the stopped worker is not started again.
    assert resumed.attempt == 2

    done = wait_status(url, job_id, "succeeded", timeout=300)
    log = messages(url, job_id)
    assert "handed back: its worker is stopping" in log
    # From the checkpoint saved on the way out, past the first regular one.
    assert _resumed_step(log) > STEPS_PER_EPOCH
    _assert_one_axis(url, done, epochs=EPOCHS)


def _cut_connections(url: str, *, seconds: float) -> int:
    """Terminate every connection to the test's database, again and again for `seconds`
    (the shared server keeps running); returns how many were cut."""
    name = make_url(url).database
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    cut, until = 0, time.monotonic() + seconds
    try:
        with admin.connect() as connection:
            while time.monotonic() < until:
                cut += len(
                    connection.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = :name AND pid <> pg_backend_pid()"
                        ),
                        {"name": name},
                    ).all()
                )
                time.sleep(0.1)
    finally:
        admin.dispose()
    return cut


def _refuse_connections(url: str, *, seconds: float) -> None:
    """The test's database refuses connections for `seconds`, its open ones cut."""
    name = make_url(url).database
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as connection:
            connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
        _cut_connections(url, seconds=0.5)
        time.sleep(seconds)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()


def _token(url: str, job_id: uuid.UUID) -> int:
    return job(url, job_id).fencing_token


def _running_elsewhere(url: str, job_id: uuid.UUID, node: str) -> Job | None:
    """The job's row once it runs on another worker than `node`."""
    row = job(url, job_id)
    return row if row.status == "running" and _node(row) != node else None


def _node(row: Job) -> str:
    assert row.worker is not None
    return row.worker.split("@")[0]


def _resumed_step(log: list[str]) -> int:
    """The step that the one resumption of the job started from."""
    resumed = [m for m in log if m.startswith("resumed from step-")]
    assert len(resumed) == 1, log
    found = re.search(r"at step (\d+)", resumed[0])
    assert found is not None
    return int(found.group(1))


def _assert_one_axis(url: str, done: Job, *, epochs: int) -> None:
    """Every series is whole, with no gap and no duplicate; every checkpoint verifies."""
    total = epochs * STEPS_PER_EPOCH
    assert (done.step, done.total_steps) == (total, total)
    assert metric_steps(url, done.id, "train/loss") == list(range(LOG_EVERY, total + 1, LOG_EVERY))
    assert metric_steps(url, done.id, "test/error") == list(
        range(STEPS_PER_EPOCH, total + 1, STEPS_PER_EPOCH)
    )
    rows, distinct = metric_counts(url, done.id)
    assert rows == distinct
    saved = checkpoint_rows(url, done.id)
    assert saved
    for row in saved:
        assert sha256_of(Path(row.path)) == row.sha256
