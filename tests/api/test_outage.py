"""A database outage: 503 with Retry-After in the error shape, and recovery with no restart."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from api.errors import DATABASE_RETRY_AFTER_S
from core.settings import Settings
from tests.helpers import TRAIN
from tests.services import POSTGRES_ADMIN_URL


@contextmanager
def database_down(url: str) -> Iterator[None]:
    """Refuse new connections to the database of `url` and cut the open ones (the shared
    server keeps running); allow them again afterwards."""
    name = make_url(url).database
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as connection:
            connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
        yield
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()


def test_an_outage_answers_503_with_retry_after_then_recovers(
    settings: Settings, client: TestClient
) -> None:
    assert client.get("/api/v1/jobs").status_code == 200
    submitted = client.post("/api/v1/jobs", json=TRAIN)
    assert submitted.status_code == 202, submitted.text

    with database_down(settings.database_url):
        for method, path, body in (
            ("GET", "/api/v1/jobs", None),
            ("GET", f"/api/v1/jobs/{submitted.json()['id']}", None),
            ("POST", "/api/v1/jobs", TRAIN),
        ):
            answer = client.request(method, path, json=body)
            assert answer.status_code == 503, (method, path, answer.text)
            assert answer.headers["retry-after"] == str(DATABASE_RETRY_AFTER_S)
            assert answer.headers["content-type"] == "application/json"
            error = answer.json()["error"]
            assert error["code"] == "unavailable"
            assert error["message"].startswith("the database is unavailable; try again in")
        assert client.get("/api/v1/readyz").status_code == 503

    # The first request after the outage succeeds: broken pooled connections were dropped.
    listed = client.get("/api/v1/jobs")
    assert listed.status_code == 200, listed.text
    assert submitted.json()["id"] in {row["id"] for row in listed.json()["items"]}
    assert client.post("/api/v1/jobs", json=TRAIN).status_code == 202
