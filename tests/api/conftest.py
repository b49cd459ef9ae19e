"""The API against real Postgres and Redis: an app per test module, a Redis db of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from core.queue import QUEUE
from core.settings import Settings
from tests.api.helpers import claim_redis_db, make_key
from tests.services import REDIS_URL, serve


@pytest.fixture(scope="module")
def broker() -> Iterator[redis.Redis]:
    """A Redis client on a database of this module's own, flushed afterwards."""
    client, _ = claim_redis_db()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def queue(broker: redis.Redis) -> redis.Redis:
    """The broker with an empty train queue."""
    broker.delete(QUEUE)
    return broker


@pytest.fixture(scope="module")
def settings(
    postgres_url: str, broker: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    """The service's settings for this module: auth on, fast event-stream polls."""
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
    )


@pytest.fixture(scope="module")
def live_url(settings: Settings) -> Iterator[str]:
    """The module's API (with the module's settings) served by uvicorn, in a thread."""
    with serve(create_app(settings)) as url:
        yield url


@pytest.fixture(scope="module")
def anonymous(settings: Settings) -> Iterator[TestClient]:
    """A client of the app that sends no API key."""
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def client(settings: Settings, anonymous: TestClient) -> Iterator[TestClient]:
    """A client of the same app with a read + train key."""
    key = make_key(settings.database_url, "read", "train")
    with TestClient(anonymous.app, headers={"Authorization": f"Bearer {key}"}) as authorized:
        yield authorized
