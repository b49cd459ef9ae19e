"""Concurrent requests against a served API on the embedded default (SQLite, a SQLite broker):
one Idempotency-Key makes one job or study, and uploads at once cannot together pass the
quota, as on Postgres."""

from __future__ import annotations

import io
import os
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from core import uploads
from core.db.session import session_scope
from core.db.tables import Job, Study
from core.settings import Settings
from tests.api.test_races import CLIENTS, _all_at_once
from tests.api.test_studies import BASE
from tests.helpers import TRAIN
from tests.services import serve

KIB = 1024


@pytest.fixture(scope="module")
def embedded(sqlite_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Auth off, SQLite for the database and the broker; a 100 KiB (on disk) upload quota."""
    root = tmp_path_factory.mktemp("embedded")
    return Settings(
        database_url=sqlite_url,
        broker_url=f"sqla+sqlite:///{root / 'broker.db'}",
        auth_enabled=False,
        artifact_dir=root / "artifacts",
        data_dir=root / "data",
        rate_limit_submits_per_minute=0,
        upload_quota_bytes=100 * KIB,
    )


@pytest.fixture(scope="module")
def api(embedded: Settings) -> Iterator[httpx.Client]:
    """A client of the embedded API served by uvicorn, with room for every client at once."""
    from api.app import create_app

    with serve(create_app(embedded)) as url:
        limits = httpx.Limits(max_connections=CLIENTS)
        with httpx.Client(base_url=f"{url}/api/v1", timeout=60, limits=limits) as client:
            # One submit first: it waits for the zoo's description and makes the broker's
            # tables, which the races should not time.
            assert client.post("/jobs", json=TRAIN).status_code == 202
            yield client


def _made(settings: Settings, table: type[Job] | type[Study], key: str) -> int:
    with session_scope(settings.database_url) as session:
        return session.scalar(select(func.count()).where(table.idempotency_key == key)) or 0


def test_concurrent_submits_with_one_idempotency_key_make_one_job(
    api: httpx.Client, embedded: Settings
) -> None:
    key = f"race-{uuid.uuid4().hex}"
    answers = _all_at_once(
        lambda c: c.post("/jobs", json=TRAIN, headers={"Idempotency-Key": key}), api
    )
    statuses = Counter(answer.status_code for answer in answers)
    assert set(statuses) <= {200, 202}, [a.text for a in answers if a.status_code >= 300]
    assert statuses[202] == 1
    assert len({answer.json()["id"] for answer in answers}) == 1
    assert _made(embedded, Job, key) == 1


def test_concurrent_studies_with_one_idempotency_key_make_one_study(
    api: httpx.Client, embedded: Settings
) -> None:
    key = f"race-{uuid.uuid4().hex}"
    body = {"base": BASE, "grid": {"recipe.lr": [0.1, 0.05]}, "seeds": 1}
    answers = _all_at_once(
        lambda c: c.post("/studies", json=body, headers={"Idempotency-Key": key}), api
    )
    statuses = Counter(answer.status_code for answer in answers)
    assert set(statuses) <= {200, 202}, [a.text for a in answers if a.status_code >= 300]
    assert statuses[202] == 1
    assert len({answer.json()["id"] for answer in answers}) == 1
    assert _made(embedded, Study, key) == 1


def _images(tag: str) -> bytes:
    """A stored zip of two 10 KiB incompressible images: about 40 KiB on disk unpacked."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for label in ("a", "b"):
            archive.writestr(f"{tag}/{label}/1.png", os.urandom(10 * KIB))
    return buffer.getvalue()


def test_uploads_sent_at_once_cannot_together_pass_the_quota(
    api: httpx.Client, embedded: Settings
) -> None:
    archives = [_images(f"t{index}") for index in range(CLIENTS)]
    sent = iter(archives)
    answers = _all_at_once(
        lambda c: c.post("/datasets", files={"file": ("a.zip", next(sent), "application/zip")}),
        api,
    )
    statuses = Counter(answer.status_code for answer in answers)
    assert set(statuses) <= {201, 413}, [a.text for a in answers if a.status_code >= 500]
    listed = api.get("/datasets/uploads").json()
    assert len(listed) == statuses[201] == 2  # two take 80 KiB of the 100; a third would not fit
    assert sum(item["bytes"] for item in listed) <= embedded.upload_quota_bytes
    kept = {path.name for path in uploads.folder(embedded).iterdir()}
    assert kept == {item["id"] for item in listed}  # the refused left nothing behind
    assert all(Path(embedded.data_dir, item["path"]).is_dir() for item in listed)
