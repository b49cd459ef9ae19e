"""The API in process against real Postgres and Redis: clients with and without a key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core.settings import Settings
from tests.helpers import make_key


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


@pytest.fixture(scope="module")
def admin(settings: Settings, anonymous: TestClient) -> Iterator[TestClient]:
    """A client of the same app with an admin key: it may change the jobs the tests make
    straight in the database, which no key owns."""
    key = make_key(settings.database_url, "admin")
    with TestClient(anonymous.app, headers={"Authorization": f"Bearer {key}"}) as authorized:
        yield authorized
