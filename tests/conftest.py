"""Shared fixtures: a fresh, migrated database per test module (Postgres or SQLite), and a
Redis database of the module's own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.db import schema
from tests.services import REDIS_URL, throwaway_database


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A new database `resnet_test_<random>`, migrated to head, dropped afterwards."""
    with throwaway_database() as url:
        schema.upgrade(url)
        yield url


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
