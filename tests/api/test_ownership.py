"""Owners over HTTP on Postgres and Redis, with auth on and several keys: a train key
changes only what it made, an admin key everything; READS_OWNER_ONLY hides another's rows
(404); an Idempotency-Key belongs to the key that sent it; with auth off all is allowed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests import images
from tests.helpers import TRAIN, Key, key_of, trained_job

JOBS = "/api/v1/jobs"
STUDIES = "/api/v1/studies"
REGISTRY = "/api/v1/registry"
PREDICT = "/api/v1/predict"
STUDY = {
    "base": {"model": {"name": "resnet8"}, "dataset": {"name": "digits"}},
    "grid": {"model.name": ["plain8", "resnet8"]},
    "seeds": 1,
}


@pytest.fixture(scope="module")
def alice(settings: Settings) -> Key:
    return key_of(settings.database_url, "read", "train")


@pytest.fixture(scope="module")
def bob(settings: Settings) -> Key:
    return key_of(settings.database_url, "read", "train")


@pytest.fixture(scope="module")
def admin(settings: Settings) -> Key:
    return key_of(settings.database_url, "admin")


@pytest.fixture(scope="module")
def owner_only(settings: Settings) -> Iterator[TestClient]:
    """A second API on the same database whose reads keep to the caller's own rows."""
    strict = settings.model_copy(update={"reads_owner_only": True})
    with TestClient(create_app(strict)) as client:
        yield client


@pytest.fixture(scope="module")
def auth_off(settings: Settings) -> Iterator[TestClient]:
    """A third API on the same database with auth off (one anonymous user, on 127.0.0.1)."""
    app = create_app(settings.model_copy(update={"auth_enabled": False}))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client


def _submit(client: TestClient, key: Key, **fields: Any) -> dict[str, Any]:
    answer = client.post(JOBS, json={**TRAIN, **fields}, headers=key.headers)
    assert answer.status_code == 202, answer.text
    return dict(answer.json())


def _image_files() -> dict[str, tuple[str, bytes, str]]:
    return {"files": ("x.png", images.flat_png(128), "image/png")}


def _refused(answer: Any, status: int, *words: str) -> None:
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]["message"]
    assert all(word in message for word in words), message


def test_a_train_key_cancels_and_deletes_only_its_own_jobs_and_admin_any(
    anonymous: TestClient, queue: redis.Redis, alice: Key, bob: Key, admin: Key
) -> None:
    job = _submit(anonymous, alice)
    assert job["owner"] == alice.id
    assert anonymous.get(f"{JOBS}/{job['id']}", headers=bob.headers).json()["owner"] == alice.id
    cancel = f"{JOBS}/{job['id']}/cancel"
    _refused(anonymous.post(cancel, headers=bob.headers), 403, f"job {job['id']}", "admin")
    refused = anonymous.delete(f"{JOBS}/{job['id']}", headers=bob.headers)
    _refused(refused, 403, "does not own", f"job {job['id']}")
    assert refused.json()["error"]["code"] == "forbidden"
    assert anonymous.get(f"{JOBS}/{job['id']}").status_code == 401  # no key, as before
    assert anonymous.post(cancel, headers=alice.headers).json()["status"] == "cancelled"
    other = _submit(anonymous, bob)
    assert anonymous.post(f"{JOBS}/{other['id']}/cancel", headers=admin.headers).status_code == 200
    assert anonymous.delete(f"{JOBS}/{other['id']}", headers=admin.headers).status_code == 204
    assert anonymous.delete(f"{JOBS}/{job['id']}", headers=alice.headers).status_code == 204


def test_a_study_and_its_jobs_belong_to_its_key(
    anonymous: TestClient, queue: redis.Redis, alice: Key, bob: Key, admin: Key
) -> None:
    answer = anonymous.post(STUDIES, json=STUDY, headers=alice.headers)
    assert answer.status_code == 202, answer.text
    study = answer.json()
    assert study["owner"] == alice.id
    assert {job["owner"] for job in study["jobs"]} == {alice.id}
    one_job = study["jobs"][0]["id"]
    _refused(anonymous.post(f"{JOBS}/{one_job}/cancel", headers=bob.headers), 403, one_job)
    url = f"{STUDIES}/{study['id']}"
    _refused(anonymous.post(f"{url}/cancel", headers=bob.headers), 403, f"study {study['id']}")
    _refused(anonymous.delete(url, headers=bob.headers), 403, f"study {study['id']}")
    assert anonymous.post(f"{url}/cancel", headers=admin.headers).json()["state"] == "cancelled"
    assert anonymous.delete(url, headers=alice.headers).status_code == 204


def test_only_the_models_owner_or_admin_adds_versions_and_moves_aliases(
    anonymous: TestClient, settings: Settings, alice: Key, bob: Key, admin: Key
) -> None:
    job_id = str(trained_job(settings))
    name = f"owned-{uuid.uuid4().hex[:8]}"
    versions, production = f"{REGISTRY}/{name}/versions", f"{REGISTRY}/{name}/aliases/production"
    first = anonymous.post(versions, json={"job": job_id}, headers=alice.headers)
    assert first.status_code == 201, first.text
    assert first.json()["owner"] == alice.id
    assert anonymous.put(production, json={"version": 1}, headers=alice.headers).status_code == 200
    model = anonymous.get(f"{REGISTRY}/{name}", headers=bob.headers).json()
    assert model["owner"] == alice.id
    quoted = f"model {name!r}"
    _refused(anonymous.put(production, json={"version": 1}, headers=bob.headers), 403, quoted)
    _refused(anonymous.delete(production, headers=bob.headers), 403, quoted)
    _refused(anonymous.post(versions, json={"job": job_id}, headers=bob.headers), 403, quoted)
    _refused(anonymous.delete(f"{versions}/1", headers=bob.headers), 403, quoted)
    assert anonymous.get(f"{REGISTRY}/{name}", headers=bob.headers).json() == model  # unchanged
    second = anonymous.post(versions, json={"job": job_id}, headers=admin.headers)
    assert (second.status_code, second.json()["owner"]) == (201, admin.id)
    moved = anonymous.put(production, json={"version": 2}, headers=admin.headers)
    assert moved.json()["version"] == 2
    assert anonymous.delete(production, headers=alice.headers).status_code == 204
    assert anonymous.delete(f"{versions}/2", headers=alice.headers).status_code == 204


def test_reads_owner_only_hides_anothers_rows_as_not_found(
    owner_only: TestClient, anonymous: TestClient, settings: Settings, queue: redis.Redis,
    alice: Key, bob: Key, admin: Key,
) -> None:  # fmt: skip
    job = _submit(owner_only, alice, name="alice's")
    mine = _submit(owner_only, bob, name="bob's")
    path = f"{JOBS}/{job['id']}"
    for suffix in ("", "/metrics", "/checkpoints", "/events"):
        _refused(owner_only.get(path + suffix, headers=bob.headers), 404, "does not exist")
    # Not 403: a key that may not read a job learns nothing of it, not even that it exists.
    _refused(owner_only.post(f"{path}/cancel", headers=bob.headers), 404, "does not exist")
    _refused(owner_only.delete(path, headers=bob.headers), 404, "does not exist")
    listed = {row["id"] for row in owner_only.get(JOBS, headers=bob.headers).json()["items"]}
    assert mine["id"] in listed
    assert job["id"] not in listed
    everyone = {row["id"] for row in owner_only.get(JOBS, headers=admin.headers).json()["items"]}
    assert {job["id"], mine["id"]} <= everyone
    assert owner_only.get(path, headers=alice.headers).json()["name"] == "alice's"
    assert owner_only.get(path, headers=admin.headers).status_code == 200
    assert anonymous.get(path, headers=bob.headers).status_code == 200  # the setting is off there
    # Edits and the owner filter keep to the same rule.
    _refused(owner_only.patch(path, json={"note": "x"}, headers=bob.headers), 404, "does not exist")
    _refused(anonymous.patch(path, json={"note": "x"}, headers=bob.headers), 403, "does not own")
    theirs = {"owner": job["owner"]}
    _refused(owner_only.get(JOBS, params=theirs, headers=bob.headers), 403, "READS_OWNER_ONLY")
    by_owner = owner_only.get(JOBS, params=theirs, headers=admin.headers).json()["items"]
    assert job["id"] in {row["id"] for row in by_owner}
    assert mine["id"] not in {row["id"] for row in by_owner}

    # An evaluation of a job the caller may not read is refused as if the job did not exist.
    source = trained_job(settings)
    evaluate = {"kind": "evaluate", "source_job": str(source), "dataset": {"name": "digits"}}
    _refused(owner_only.post(JOBS, json=evaluate, headers=bob.headers), 422, "is not a train job")
    assert owner_only.post(JOBS, json=evaluate, headers=admin.headers).status_code == 202


def test_reads_owner_only_hides_anothers_studies_and_models(
    owner_only: TestClient, settings: Settings, queue: redis.Redis,
    alice: Key, bob: Key, admin: Key,
) -> None:  # fmt: skip
    study = owner_only.post(STUDIES, json=STUDY, headers=alice.headers).json()
    path = f"{STUDIES}/{study['id']}"
    for suffix in ("", "/results.csv", "/results.md", "/curves"):
        _refused(owner_only.get(path + suffix, headers=bob.headers), 404, "does not exist")
    _refused(owner_only.post(f"{path}/cancel", headers=bob.headers), 404, "does not exist")
    assert study["id"] not in {s["id"] for s in owner_only.get(STUDIES, headers=bob.headers).json()}
    assert study["id"] in {s["id"] for s in owner_only.get(STUDIES, headers=alice.headers).json()}
    assert study["id"] in {s["id"] for s in owner_only.get(STUDIES, headers=admin.headers).json()}

    name = f"hidden-{uuid.uuid4().hex[:8]}"
    job_id = str(trained_job(settings))  # made with no owner: only admin keys read it here
    refused = owner_only.post(
        f"{REGISTRY}/{name}/versions", json={"job": job_id}, headers=bob.headers
    )
    _refused(refused, 422, "is not a train job")
    made = owner_only.post(
        f"{REGISTRY}/{name}/versions", json={"job": job_id}, headers=admin.headers
    )
    assert made.status_code == 201, made.text
    _refused(owner_only.get(f"{REGISTRY}/{name}", headers=bob.headers), 404, "is not registered")
    alias = f"{REGISTRY}/{name}/aliases/production"
    _refused(owner_only.put(alias, json={"version": 1}, headers=bob.headers), 404, "not registered")
    names = [m["name"] for m in owner_only.get(REGISTRY, headers=bob.headers).json()["items"]]
    assert name not in names
    names = [m["name"] for m in owner_only.get(REGISTRY, headers=admin.headers).json()["items"]]
    assert name in names

    # Predictions too: a predict key reads only its own key's models and jobs.
    seer = key_of(settings.database_url, "predict")
    for ref, words in ((name, "is not registered"), (job_id, "does not exist")):
        refused = owner_only.post(
            PREDICT, params={"model": ref}, files=_image_files(), headers=seer.headers
        )
        _refused(refused, 404, words)
    served = owner_only.post(
        PREDICT, params={"model": name}, files=_image_files(), headers=admin.headers
    )
    assert served.status_code == 200, served.text
    assert served.json()["model"]["name"] == name


def test_an_idempotency_key_belongs_to_the_key_that_sent_it(
    anonymous: TestClient, queue: redis.Redis, alice: Key, bob: Key
) -> None:
    same = {"Idempotency-Key": f"shared-{uuid.uuid4()}"}
    first = anonymous.post(JOBS, json=TRAIN, headers=alice.headers | same)
    other = anonymous.post(JOBS, json=TRAIN, headers=bob.headers | same)
    again = anonymous.post(JOBS, json=TRAIN, headers=alice.headers | same)
    assert (first.status_code, other.status_code, again.status_code) == (202, 202, 200)
    assert first.json()["id"] == again.json()["id"] != other.json()["id"]
    assert (first.json()["owner"], other.json()["owner"]) == (alice.id, bob.id)
    # A different spec under one's own key is still a conflict; under another's, a new job.
    changed = {**TRAIN, "name": "changed"}
    _refused(anonymous.post(JOBS, json=changed, headers=bob.headers | same), 409, "different spec")

    studies = [
        anonymous.post(STUDIES, json=STUDY, headers=key.headers | same) for key in (alice, bob)
    ]
    assert [answer.status_code for answer in studies] == [202, 202]
    assert studies[0].json()["id"] != studies[1].json()["id"]
    replay = anonymous.post(STUDIES, json=STUDY, headers=bob.headers | same)
    assert (replay.status_code, replay.json()["id"]) == (200, studies[1].json()["id"])


def test_with_auth_off_everything_is_allowed_and_rows_have_no_owner(
    auth_off: TestClient, anonymous: TestClient, queue: redis.Redis, alice: Key, bob: Key,
    admin: Key,
) -> None:  # fmt: skip
    hers = _submit(anonymous, alice)
    cancelled = auth_off.post(f"{JOBS}/{hers['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    nobodys = auth_off.post(JOBS, json=TRAIN)
    assert nobodys.status_code == 202
    assert nobodys.json()["owner"] is None
    same = {"Idempotency-Key": f"anonymous-{uuid.uuid4()}"}
    assert auth_off.post(JOBS, json=TRAIN, headers=same).status_code == 202
    assert auth_off.post(JOBS, json=TRAIN, headers=same).status_code == 200  # one owner: none
    # Once auth is on, a job without an owner is changed by admin keys only.
    path = f"{JOBS}/{nobodys.json()['id']}"
    _refused(anonymous.post(f"{path}/cancel", headers=bob.headers), 403, "does not own")
    assert anonymous.post(f"{path}/cancel", headers=admin.headers).status_code == 200
    assert auth_off.delete(path).status_code == 204


def _owned_by(settings: Settings, key: Key) -> str:
    """A succeeded train job with real checkpoints, made by `key`."""
    job_id = trained_job(settings)
    with session_scope(settings.database_url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.owner_key_id = uuid.UUID(key.id)
    return str(job_id)


def test_only_the_jobs_owner_or_admin_registers_it_and_its_owner_removes_its_versions(
    anonymous: TestClient, settings: Settings, alice: Key, bob: Key, admin: Key
) -> None:
    job_id = _owned_by(settings, alice)
    name = f"pinned-{uuid.uuid4().hex[:8]}"
    versions = f"{REGISTRY}/{name}/versions"
    refused = anonymous.post(versions, json={"job": job_id}, headers=bob.headers)
    _refused(refused, 403, f"does not own job {job_id}", "register")
    assert anonymous.get(f"{REGISTRY}/{name}", headers=bob.headers).status_code == 404
    # An admin's version of it is the job owner's to remove, so the job can go.
    made = anonymous.post(versions, json={"job": job_id}, headers=admin.headers)
    assert made.status_code == 201, made.text
    job = f"{JOBS}/{job_id}"
    _refused(anonymous.delete(job, headers=alice.headers), 409, f"{name}/1")
    _refused(anonymous.delete(f"{versions}/1", headers=bob.headers), 403, f"model {name!r}")
    assert anonymous.delete(f"{versions}/1", headers=alice.headers).status_code == 204
    assert anonymous.delete(job, headers=alice.headers).status_code == 204


def test_a_job_is_at_most_max_versions_per_job_versions(settings: Settings, alice: Key) -> None:
    sent, mine = {"json": {"job": _owned_by(settings, alice)}}, alice.headers
    bounded = settings.model_copy(update={"max_versions_per_job": 2})
    with TestClient(create_app(bounded)) as client:
        for index in range(2):
            answer = client.post(f"{REGISTRY}/many-{index}/versions", **sent, headers=mine)
            assert answer.status_code == 201, answer.text
        third = client.post(f"{REGISTRY}/many-0/versions", **sent, headers=mine)
        _refused(third, 409, "MAX_VERSIONS_PER_JOB (2)", "many-0/1", "many-1/1")
        assert client.delete(f"{REGISTRY}/many-1/versions/1", headers=mine).status_code == 204
        again = client.post(f"{REGISTRY}/many-0/versions", **sent, headers=mine)
        assert (again.status_code, again.json()["version"]) == (201, 2)
