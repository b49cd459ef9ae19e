"""Shared fixtures: a fresh, migrated database per test module (Postgres or SQLite), a Redis
database of the module's own, and the service's settings and live API on both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.db import schema
from core.queue import QUEUE
from core.resources import ALL_QUEUES
from core.settings import Settings
from tests.services import REDIS_URL, claimed_redis_db, s3_server, serve, throwaway_database


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A new database `resnet_test_<random>`, migrated to head, dropped afterwards."""
    with throwaway_database() as url:
        schema.upgrade(url)
        yield url


@pytest.fixture(scope="module")
def redis_broker_url() -> Iterator[str]:
    """A Redis database of this module's own, as a broker URL."""
    with claimed_redis_db() as (_, url):
        yield url


@pytest.fixture(scope="module")
def broker() -> Iterator[redis.Redis]:
    """A Redis client on a database of this module's own."""
    with claimed_redis_db() as (client, _):
        yield client


@pytest.fixture
def queue(broker: redis.Redis) -> redis.Redis:
    """The broker with empty job queues (`cpu` is the one most tests read)."""
    broker.delete(QUEUE, *ALL_QUEUES)
    return broker


@pytest.fixture(scope="module")
def settings(
    postgres_url: str, broker: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    """The service's settings for this module: auth on, fast event-stream polls, no submit
    rate limit."""
    root = tmp_path_factory.mktemp("service")
    db = broker.connection_pool.connection_kwargs["db"]
    return Settings(
        database_url=postgres_url,
        broker_url=f"{REDIS_URL}/{db}",
        artifact_dir=root / "artifacts",
        data_dir=root / "data",
        auth_enabled=True,
        stream_poll_seconds=0.05,
        max_upload_bytes=64 * 1024,
        rate_limit_submits_per_minute=0,  # tests submit in bursts; tests/api/test_limits.py
        # A model process's ONNX export takes seconds; tests/api/test_backends.py serves it.
        predict_backend="torch",
    )


@pytest.fixture
def local_settings(tmp_path: Path) -> Settings:
    """The service's defaults with artifacts and data under the test's own folder, for tests
    that reach no database or broker."""
    return Settings(artifact_dir=tmp_path / "artifacts", data_dir=tmp_path / "data")


@pytest.fixture(scope="module")
def live_url(settings: Settings) -> Iterator[str]:
    """The module's API (with the module's settings) served by uvicorn, in a thread."""
    from api.app import create_app  # here: test runs that serve no API skip its imports

    with serve(create_app(settings)) as url:
        yield url


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A new SQLite file, migrated to head."""
    path: Path = tmp_path_factory.mktemp("db") / "resnet.db"
    url = f"sqlite:///{path}"
    schema.upgrade(url)
    return url


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test that asks for it runs on Postgres and on SQLite."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    """An S3 server (moto's) of this module's own, as an endpoint URL; fails if it cannot
    start."""
    with s3_server() as url:
        yield url
