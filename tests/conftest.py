"""Shared fixtures: a fresh, migrated database per test module (Postgres or SQLite)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from core.db import schema

# The services CI starts (.ci/run); a test that needs one fails when it is down.
POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379"


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A new database `resnet_test_<random>`, migrated to head, dropped afterwards."""
    name = f"resnet_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    schema.upgrade(url)
    yield url
    from core.db.session import get_engine

    get_engine(url).dispose()
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


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
