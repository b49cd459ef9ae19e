"""Shared fixtures: a fresh, migrated database per test module (Postgres or SQLite)."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool
from starlette.types import ASGIApp

from core.db import schema

# The services CI starts (.ci/run); a test that needs one fails when it is down.
POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serve(app: ASGIApp) -> Iterator[str]:
    """`app` served by uvicorn on a free port of 127.0.0.1, in a thread; its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped while starting"
        assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


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
