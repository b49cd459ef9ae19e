"""The services the tests (and the benchmarks) run against: Postgres, Redis, local servers."""

from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
import uvicorn
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool
from starlette.types import ASGIApp

from core.db.session import get_engine

# The services CI starts (.ci/run); a test that needs one fails when it is down.
POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379"
REDIS_LOCK = "resnet-test-lock"  # marks a Redis database a test run holds


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


@contextmanager
def claimed_redis_db() -> Iterator[tuple[redis.Redis, str]]:
    """A Redis database 1..15 that no other test run holds (a lock key marks it), flushed
    before and after; its client and URL."""
    token = uuid.uuid4().hex
    for number in random.sample(range(1, 16), 15):
        url = f"{REDIS_URL}/{number}"
        client = redis.Redis.from_url(url)
        if client.set(REDIS_LOCK, token, nx=True, ex=3600):
            try:
                client.flushdb()
                client.set(REDIS_LOCK, token, ex=3600)  # the flush took the lock too
                yield client, url
            finally:
                client.flushdb()
                client.close()
            return
        client.close()
    raise RuntimeError("every Redis database 1..15 is held by another test run")


@contextmanager
def throwaway_database(prefix: str = "resnet_test") -> Iterator[str]:
    """A new, empty Postgres database `<prefix>_<random>`; dropped afterwards, with any
    connection still open to it."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        try:
            yield url
        finally:
            get_engine(url).dispose()
            # FORCE terminates the connections others left open (a server thread, a worker).
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
