"""Helpers of the worker tests: real worker processes and the service they make up, job
submission, polling with deadlines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import func, select

from core import jobs, queue
from core.db.session import session_scope
from core.db.tables import Checkpoint, Event, Job, Metric
from core.kinds import EvaluateJobSpec, TrainJobSpec
from core.settings import Settings

T = TypeVar("T")
BIN = Path(sys.executable).parent
LOG_EVERY = 11  # digits with batch 64 and no validation split: 22 steps per epoch
LEASE_SECONDS = 6
HEARTBEAT_SECONDS = 1.0


def recipe(epochs: int) -> dict[str, Any]:
    """A tiny digits recipe: resnet8, batch 64, no augmentation, checkpoint every epoch."""
    return {"epochs": epochs, "batch_size": 64, "augment": False, "log_every": LOG_EVERY}


def train_spec(epochs: int) -> TrainJobSpec:
    """ResNet-8 on scikit-learn's digits (always available offline) for `epochs` epochs."""
    return TrainJobSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "validation": 0},
            "recipe": recipe(epochs),
        }
    )


def service_env(settings: Settings, artifacts: Path) -> dict[str, str]:
    """The environment of a worker process: the test's database, broker and a short lease."""
    return {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "BROKER_URL": settings.broker_url,
        "ARTIFACT_DIR": str(artifacts),
        "DATA_DIR": str(artifacts.parent / "data"),
        "LEASE_SECONDS": str(settings.lease_seconds),
        "HEARTBEAT_SECONDS": str(settings.heartbeat_seconds),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


class WorkerProcess:
    """`resnet-service worker` in its own process group, its output in a log file."""

    def __init__(self, name: str, env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(BIN / "resnet-service"), "worker", "--name", f"{name}@%h"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 300) -> None:
        """Wait until Celery says the worker is ready (its reaper starts then); importing
        torch at nice 19 on two busy cores can take minutes."""
        wait_for(
            lambda: "ready." in self.output() or self.process.poll() is not None,
            timeout,
            f"{self.name} to start",
        )
        assert self.process.poll() is None, f"{self.name} exited:\n{self.output()}"

    def output(self) -> str:
        """Everything the worker logged so far."""
        return self.log.read_text(errors="replace")

    def kill_all(self) -> None:
        """kill -9 the worker and its job process (the whole process group)."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop_warm(self, timeout: float = 60) -> int:
        """SIGTERM (a warm shutdown, as `docker compose stop`); the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        """Cold shutdown, then kill whatever is left."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
        self.kill_all()


@dataclass
class Service:
    """A database, a broker, artifact storage and the worker processes serving them."""

    settings: Settings
    root: Path
    workers: dict[str, WorkerProcess] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.settings.database_url

    def start(self, *names: str) -> None:
        """Start workers (in parallel) and wait until each is ready."""
        env = service_env(self.settings, self.root / "artifacts")
        for name in names:
            self.workers[name] = WorkerProcess(name, env, self.root / f"{name}.log")
        for name in names:
            self.workers[name].wait_ready()

    def stop(self) -> None:
        """Stop every worker, killing what does not stop."""
        for worker in self.workers.values():
            worker.stop()

    def logs(self) -> str:
        """All worker output (for assertion messages)."""
        return "\n".join(f"--- {n}\n{w.output()[-3000:]}" for n, w in self.workers.items())


def make_settings(database_url: str, broker_url: str, root: Path) -> Settings:
    """The settings the tests and their workers share."""
    return Settings(
        database_url=database_url,
        broker_url=broker_url,
        artifact_dir=root / "artifacts",
        data_dir=root / "data",
        lease_seconds=LEASE_SECONDS,
        heartbeat_seconds=HEARTBEAT_SECONDS,
    )


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, every: float = 0.1) -> T:
    """Poll `condition` until it returns something truthy, or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def submit(
    settings: Settings,
    spec: TrainJobSpec | EvaluateJobSpec,
    *,
    deliveries: int = 1,
    max_attempts: int = 3,
) -> uuid.UUID:
    """Create the job, commit, then enqueue its id `deliveries` times (as the API does once)."""
    with session_scope(settings.database_url) as session:
        job_id = jobs.create(session=session, spec=spec, max_attempts=max_attempts).id
    for _ in range(deliveries):
        queue.enqueue(job_id, settings=settings)
    return job_id


def job(url: str, job_id: uuid.UUID) -> Job:
    """The job's row, freshly read."""
    with session_scope(url) as session:
        row = session.get(Job, job_id)
        assert row is not None
        return row


def wait_status(url: str, job_id: uuid.UUID, status: str, timeout: float = 90) -> Job:
    """Wait until the job has `status`; fail at once if it ends otherwise."""

    def reached() -> Job | None:
        row = job(url, job_id)
        ended = row.status in ("succeeded", "failed", "cancelled")
        assert row.status == status or not ended, (
            f"job ended {row.status} (error: {row.error}), not {status}; "
            f"events: {messages(url, job_id)}"
        )
        return row if row.status == status else None

    return wait_for(reached, timeout, f"job {job_id} to be {status}")


def messages(url: str, job_id: uuid.UUID) -> list[str]:
    """The job's event log, oldest first."""
    with session_scope(url) as session:
        query = select(Event.message).where(Event.job_id == job_id).order_by(Event.id)
        return list(session.scalars(query))


def metric_steps(url: str, job_id: uuid.UUID, name: str) -> list[int]:
    """The steps of one metric series, in order."""
    with session_scope(url) as session:
        query = select(Metric.step).where(Metric.job_id == job_id, Metric.name == name)
        return list(session.scalars(query.order_by(Metric.step)))


def metric_counts(url: str, job_id: uuid.UUID) -> tuple[int, int]:
    """(rows, distinct (name, step) pairs) of a job's metrics."""
    with session_scope(url) as session:
        rows = session.scalar(select(func.count()).where(Metric.job_id == job_id))
        pairs = select(Metric.name, Metric.step).where(Metric.job_id == job_id).distinct()
        distinct = session.scalar(select(func.count()).select_from(pairs.subquery()))
        return rows or 0, distinct or 0


def checkpoint_rows(url: str, job_id: uuid.UUID) -> list[Checkpoint]:
    """The job's checkpoint rows, by step."""
    with session_scope(url) as session:
        query = select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
        return list(session.scalars(query))


def job_pid(row: Job) -> int:
    """The pid of the process running a job, from its `worker` column ("name pid N")."""
    assert row.worker is not None
    return int(row.worker.rsplit(" pid ", 1)[1])
