"""Fixtures of the worker tests: a Redis database of their own, and real worker processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from core.settings import Settings
from tests.conftest import REDIS_URL
from tests.worker.support import WorkerProcess, service_env

LEASE_SECONDS = 6
HEARTBEAT_SECONDS = 1.0


@pytest.fixture(scope="module")
def redis_broker_url() -> Iterator[str]:
    """A Redis database number no other test run holds (a lock key marks it), flushed."""
    token = uuid.uuid4().hex
    for number in range(1, 16):
        client = redis.Redis.from_url(f"{REDIS_URL}/{number}")
        if client.set("resnet-test-lock", token, nx=True, ex=3600):
            client.flushdb()
            client.set("resnet-test-lock", token, ex=3600)
            yield f"{REDIS_URL}/{number}"
            client.flushdb()
            client.close()
            return
        client.close()
    raise RuntimeError("every Redis database 1-15 is held by another test run")


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


@pytest.fixture(scope="module")
def service(
    postgres_url: str, redis_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """Two workers on Postgres and Redis (as `resnet-service worker` runs them)."""
    root = tmp_path_factory.mktemp("service")
    running = Service(make_settings(postgres_url, redis_broker_url, root), root)
    try:
        running.start("w1", "w2")
        yield running
    finally:
        running.stop()
