"""Fixtures of the worker tests: real worker processes on Postgres and Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.services import Service, make_settings


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
