"""Redis restarted with jobs queued, its data lost: every job ends exactly once.

A private redis-server (no persistence, as `--save ""`) serves as the broker, so the shared
one is never touched. Jobs are queued, two workers start on them, and Redis is killed and
started again empty mid-way: the reapers re-enqueue the queued jobs whose messages died with
it, and the claim in Postgres keeps any duplicate from running twice.

The default run queues `RESNET_FAULT_JOBS` = 20 one-step jobs; the 500 of the acceptance run:
`RESNET_FAULT_JOBS=500 pytest tests/worker/test_broker_restart.py`.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

from core import queue
from core.db.session import session_scope
from core.db.tables import Event, Job
from core.kinds import TrainJobSpec
from tests.helpers import submit, wait_for
from tests.services import Service, free_port, make_settings

pytestmark = pytest.mark.slow

JOBS = int(os.environ.get("RESNET_FAULT_JOBS", "20"))
ONE_STEP = TrainJobSpec.model_validate(
    {
        "model": {"name": "resnet8"},
        "dataset": {
            "name": "synthetic",
            "image_size": 8,
            "train_size": 16,
            "test_size": 8,
            "validation": 0,
        },
        "recipe": {"iterations": 1, "batch_size": 16, "augment": False},
    }
)


class RedisServer:
    """A redis-server of the test's own on a free port, without persistence."""

    def __init__(self, directory: Path) -> None:
        self.port, self.directory = free_port(), directory
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (empty) and wait until it answers."""
        arguments = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        arguments += ["--appendonly", "no", "--dir", str(self.directory)]
        self.process = subprocess.Popen(
            ["redis-server", *arguments], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: self._answers(client), 30, "redis-server to start")
        client.close()

    def kill(self) -> None:
        """kill -9: everything it held is gone."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)

    @staticmethod
    def _answers(client: redis.Redis) -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private Redis, killed at the end."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_a_redis_restart_loses_no_queued_job_and_runs_none_twice(
    postgres_url: str, private_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("service")
    service = Service(make_settings(postgres_url, private_redis.url, root), root)
    ids = {submit(service.settings, ONE_STEP) for _ in range(JOBS)}
    assert queue.depth(service.settings) == JOBS
    started = time.monotonic()
    try:
        service.start("w1", "w2")
        wait_for(lambda: _ended(postgres_url) >= 2, 300, "the first jobs to end")
        private_redis.kill()
        private_redis.start()  # empty: the queued messages are lost
        lost = JOBS - _ended(postgres_url)
        assert lost > 0
        assert queue.depth(service.settings) == 0
        wait_for(lambda: _ended(postgres_url) == JOBS, 120 + 10 * JOBS, "every job to end")
    finally:
        service.stop()
    elapsed = time.monotonic() - started

    with session_scope(postgres_url) as session:
        rows = session.execute(select(Job.id, Job.status, Job.attempt)).all()
        attempts = Counter(
            session.scalars(select(Event.job_id).where(Event.message.startswith("attempt ")))
        )
        re_enqueued = session.scalar(
            select(func.count()).where(Event.message.contains("message lost?"))
        )
    assert {row.id for row in rows} == ids
    assert Counter(row.status for row in rows) == {"succeeded": JOBS}
    assert {row.attempt for row in rows} == {1}  # none ran twice...
    assert attempts == dict.fromkeys(ids, 1)  # ...nor started twice
    assert re_enqueued is not None
    assert re_enqueued >= lost - 2  # the lost ones came back by the reapers
    print(f"{JOBS} jobs, {lost} queued when Redis restarted: all ended once in {elapsed:.0f} s")


def _ended(url: str) -> int:
    with session_scope(url) as session:
        ended = select(func.count()).where(Job.status.in_(("succeeded", "failed", "cancelled")))
        return session.scalar(ended) or 0
