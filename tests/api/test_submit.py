"""POST /jobs: valid specs are committed, then enqueued once; invalid ones enqueue nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from api.deps import KeyCache
from core import keys
from core.db.session import session_scope
from core.db.tables import ApiKey, Job
from core.queue import QUEUE
from core.settings import Settings
from tests.helpers import TRAIN, FakeClock, claim, finish, make_key, new_job, queued_ids

JOBS = "/api/v1/jobs"
LOCAL = "http://127.0.0.1:8000"  # with auth off the app answers to loopback names only


def _job_count(url: str) -> int:
    with session_scope(url) as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


def test_a_valid_train_job_is_committed_then_enqueued_once(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    body = {**TRAIN, "name": "r20 digits", "recipe": {"epochs": 5}}
    response = client.post(JOBS, json=body)
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["status"] == "queued"
    assert job["spec"]["recipe"]["epochs"] == 5
    assert job["links"]["cancel"] == f"{JOBS}/{job['id']}/cancel"
    assert queued_ids(queue) == [job["id"]]
    with session_scope(settings.database_url) as session:
        row = session.get(Job, uuid.UUID(job["id"]))
        assert row is not None
        assert (row.status, row.name, row.model_name) == ("queued", "r20 digits", "resnet20")
        assert row.owner_key_id is not None


def _evaluate(source: object) -> dict[str, Any]:
    return {"kind": "evaluate", "source_job": str(source), "dataset": {"name": "digits"}}


INVALID = {
    "unknown model": (
        {**TRAIN, "model": {"name": "resnet21"}},
        ["body", "model"],
        "6n+2",
    ),
    "negative lr": ({**TRAIN, "recipe": {"lr": -0.1}}, ["body", "recipe", "lr"], "greater than 0"),
    "unknown field": ({**TRAIN, "colour": "red"}, ["body", "colour"], "Extra inputs"),
    "unknown dataset": (
        {**TRAIN, "dataset": {"name": "imagenet21k"}},
        ["body", "dataset"],
        "'imagenet21k'",
    ),
    "unknown dataset field": (
        {**TRAIN, "dataset": {"name": "digits", "colour": 1}},
        ["body", "dataset", "colour"],
        "Extra inputs",
    ),
    "evaluate of a missing job": (
        _evaluate(uuid.uuid4()),
        ["body", "source_job"],
        "is not a train job",
    ),
}


@pytest.mark.parametrize("case", INVALID.keys())
def test_invalid_specs_are_422_per_field_and_enqueue_nothing(
    client: TestClient, queue: redis.Redis, settings: Settings, case: str
) -> None:
    body, loc, words = INVALID[case]
    before = _job_count(settings.database_url)
    response = client.post(JOBS, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert {"loc": loc, "msg": error["details"][0]["msg"]} == error["details"][0]
    assert words in error["details"][0]["msg"]
    assert words in error["message"]
    assert queue.llen(QUEUE) == 0
    assert _job_count(settings.database_url) == before


def test_evaluate_of_a_queued_job_is_422_and_of_a_succeeded_one_202(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    source = new_job(settings.database_url)
    response = client.post(JOBS, json=_evaluate(source))
    assert response.status_code == 422
    assert response.json()["error"]["message"].endswith("is queued, not succeeded")
    assert queue.llen(QUEUE) == 0
    finish(settings.database_url, source, claim(settings.database_url, source))
    response = client.post(JOBS, json=_evaluate(source))
    assert response.status_code == 202, response.text
    assert response.json()["source_job"] == str(source)
    assert queued_ids(queue) == [response.json()["id"]]


def test_the_same_idempotency_key_gives_the_same_job_once(
    client: TestClient, queue: redis.Redis
) -> None:
    headers = {"Idempotency-Key": f"submit-{uuid.uuid4()}"}
    first = client.post(JOBS, json=TRAIN, headers=headers)
    again = client.post(JOBS, json=TRAIN, headers=headers)
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    assert queued_ids(queue) == [first.json()["id"]]
    other = client.post(JOBS, json={**TRAIN, "name": "else"}, headers=headers)
    assert other.status_code == 409
    assert "different spec" in other.json()["error"]["message"]
    assert queue.llen(QUEUE) == 1


def test_keys_missing_wrong_or_short_of_scope(
    anonymous: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    missing = anonymous.get(JOBS)
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    assert missing.json()["error"]["code"] == "unauthorized"
    for wrong in ("rs_00000000_nope", "not-a-key", make_key(settings.database_url, "read") + "x"):
        response = anonymous.get(JOBS, headers={"Authorization": f"Bearer {wrong}"})
        assert response.status_code == 401, wrong
    reader = {"Authorization": f"Bearer {make_key(settings.database_url, 'read')}"}
    assert anonymous.get(JOBS, headers=reader).status_code == 200
    refused = anonymous.post(JOBS, json=TRAIN, headers=reader)
    assert refused.status_code == 403
    assert "'train' scope" in refused.json()["error"]["message"]
    assert queue.llen(QUEUE) == 0


def test_admin_keys_create_and_revoke_keys(anonymous: TestClient, settings: Settings) -> None:
    admin = {"Authorization": f"Bearer {make_key(settings.database_url, 'admin')}"}
    created = anonymous.post("/api/v1/keys", json={"name": "ci", "scopes": ["read"]}, headers=admin)
    assert created.status_code == 201, created.text
    reader = {"Authorization": f"Bearer {created.json()['key']}"}
    assert anonymous.get(JOBS, headers=reader).status_code == 200
    assert anonymous.get("/api/v1/keys", headers=reader).status_code == 403
    revoked = anonymous.delete(f"/api/v1/keys/{created.json()['id']}", headers=admin)
    assert revoked.json()["revoked_at"] is not None
    assert anonymous.get(JOBS, headers=reader).status_code == 401


def test_a_key_revoked_elsewhere_stops_working_within_the_auth_cache_time(
    settings: Settings,
) -> None:
    quick = settings.model_copy(update={"auth_cache_seconds": 0.5})
    key = make_key(settings.database_url, "read")
    app, clock = create_app(quick), FakeClock()
    app.state.keys = KeyCache(clock=clock)  # the kept checks age only when the test says
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as client:
        assert client.get(JOBS).status_code == 200  # checked against the database, kept
        with session_scope(settings.database_url) as session:  # as another API process does
            row = session.scalars(select(ApiKey).where(ApiKey.prefix == key.split("_")[1])).one()
            keys.revoke_key(session=session, key_id=row.id)
        assert client.get(JOBS).status_code == 200  # the kept check, for at most 0.5 s
        clock.advance(0.6)
        assert client.get(JOBS).status_code == 401


def test_a_body_over_the_limit_is_413(client: TestClient, queue: redis.Redis) -> None:
    response = client.post(JOBS, json={**TRAIN, "name": "x" * 2_000_000})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert queue.llen(QUEUE) == 0


def test_a_job_whose_enqueue_fails_stays_queued_and_is_accepted(settings: Settings) -> None:
    down = settings.model_copy(
        update={"broker_url": "redis://127.0.0.1:1/0", "auth_enabled": False}
    )
    with TestClient(create_app(down), base_url=LOCAL) as client:
        response = client.post(JOBS, json=TRAIN)
    assert response.status_code == 202
    with session_scope(settings.database_url) as session:
        row = session.get(Job, uuid.UUID(response.json()["id"]))
        assert row is not None
        assert row.status == "queued"
