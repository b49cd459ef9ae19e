"""GET /jobs?filter=data_digest=...: every job of one data digest, whole or by its start,
on Postgres and on SQLite; a job shows the data it read and what it ran on."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from client.filters import JobFilter
from core import job_queries, jobs
from core.db.session import session_scope
from core.settings import Settings
from tests.helpers import claim, new_job

JOBS = "/api/v1/jobs"
ENVIRONMENT = {"torch": "2.0", "device": "cpu model", "device_type": "cpu", "device_count": 1}


def _digests() -> tuple[str, str, str]:
    """Three digests, the first two of one 8-digit start (fresh per run: the database is shared)."""
    start = uuid.uuid4().hex[:8]
    return (
        f"sha256:{start}{'a' * 56}",
        f"sha256:{start}{'b' * 56}",
        f"sha256:{uuid.uuid4().hex[:8]}{'c' * 56}",
    )


def _seed(url: str, digests: tuple[str, str, str]) -> dict[str, list[uuid.UUID]]:
    """Per digest its jobs (running, or succeeded), and a job that loaded no data yet."""
    made: dict[str, list[uuid.UUID]] = {digest: [] for digest in digests}
    for digest, finished in [
        (digests[0], True),
        (digests[0], False),
        *[(d, True) for d in digests[1:]],
    ]:
        job_id = new_job(url, model={"name": "resnet8"}, dataset={"name": "digits"})
        token = claim(url, job_id)
        data = {"digest": digest, "classes": ["0", "1"], "splits": {"train": 2}, "skipped": []}
        with session_scope(url) as session:
            jobs.record_run(
                session=session, job_id=job_id, token=token, data=data, environment=ENVIRONMENT
            )
            if finished:
                jobs.finish(session=session, job_id=job_id, token=token, status="succeeded")
        made[digest].append(job_id)
    new_job(url, model={"name": "resnet8"}, dataset={"name": "digits"})  # no data read yet
    return made


def _ids(client: TestClient, expression: str) -> set[uuid.UUID]:
    response = client.get(JOBS, params={"filter": expression, "limit": 200})
    assert response.status_code == 200, response.text
    return {uuid.UUID(job["id"]) for job in response.json()["items"]}


def test_a_digest_finds_exactly_its_jobs_whole_bare_or_by_its_start(
    client: TestClient, settings: Settings
) -> None:
    digests = _digests()
    made = _seed(settings.database_url, digests)
    first, second, third = digests
    bare = first.removeprefix("sha256:")
    assert _ids(client, f"data_digest={first}") == set(made[first])
    assert _ids(client, f"data_digest={bare}") == set(made[first])  # without "sha256:"
    assert _ids(client, f"data_digest={bare.upper()}") == set(made[first])
    assert _ids(client, f"data_digest={bare[:8]}") == set(made[first] + made[second])
    assert _ids(client, f"data_digest={bare[:10]}") == set(made[first])
    assert _ids(client, f"data_digest={third}") == set(made[third])
    everyone = set(made[first] + made[second] + made[third])
    assert not _ids(client, f"data_digest!={first}") & set(made[first])
    assert _ids(client, f"data_digest!={first}") >= everyone - set(made[first])
    assert not _ids(client, "data_digest=null") & everyone
    job = client.get(f"{JOBS}/{made[first][1]}").json()
    assert job["data_digest"] == first
    assert job["data"]["classes"] == ["0", "1"]
    assert job["environment"] == ENVIRONMENT
    listed = client.get(JOBS, params={"filter": f"data_digest={first}"}).json()["items"]
    assert {item["data_digest"] for item in listed} == {first}


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"filter": "data_digest=3f2a"}, "first 8 or more"),
        ({"filter": "data_digest=sha256:xyz12345"}, "64 hex digits"),
        ({"filter": "data_digest~3f2a9c01"}, "match it with = or !="),
        ({"filter": "data_digest>3f2a9c01"}, "match it with = or !="),
        ({"sort": "data_digest"}, "not an order"),
    ],
)
def test_a_bad_digest_filter_is_a_422_saying_how_to_write_one(
    client: TestClient, params: dict[str, str], says: str
) -> None:
    response = client.get(JOBS, params=params)
    assert response.status_code == 422
    assert says in response.json()["error"]["details"][0]["msg"]


def test_the_digest_filter_works_on_sqlite(sqlite_url: str) -> None:
    digests = _digests()
    made = _seed(sqlite_url, digests)
    bare = digests[0].removeprefix("sha256:")
    for expression, expected in [
        (f"data_digest={digests[0]}", made[digests[0]]),
        (f"data_digest={bare[:8]}", made[digests[0]] + made[digests[1]]),
    ]:
        filters = JobFilter(filter=[expression], sort="created")
        with session_scope(sqlite_url) as session:
            found, _ = job_queries.list_jobs(session=session, filters=filters, limit=100)
            assert {job.id for job in found} == set(expected), expression
