"""The model registry over HTTP: register, alias, list, delete, and who may do what."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from tests.helpers import make_key, new_job, trained_job


@pytest.fixture(scope="module")
def job_id(settings: Settings) -> uuid.UUID:
    """One succeeded job for the module's registrations."""
    return trained_job(settings)


def test_register_alias_list_and_delete(client: TestClient, job_id: uuid.UUID) -> None:
    first = client.post("/api/v1/registry/digits-net/versions", json={"job": str(job_id)})
    assert first.status_code == 201, first.text
    assert first.json()["version"] == 1
    assert first.json()["checkpoint"] == "best"
    last = client.post(
        "/api/v1/registry/digits-net/versions", json={"job": str(job_id), "checkpoint": "last"}
    )
    assert last.json()["version"] == 2
    alias = client.put("/api/v1/registry/digits-net/aliases/production", json={"version": 1})
    assert alias.status_code == 200, alias.text
    assert alias.json()["version"] == 1

    listed = client.get("/api/v1/registry", params={"q": "digits-net"}).json()
    (model,) = listed["items"]
    assert [v["version"] for v in model["versions"]] == [1, 2]
    version = model["versions"][0]
    assert (version["job_id"], version["model"], version["dataset"]) == (
        str(job_id),
        "resnet8",
        "digits",
    )
    assert (version["test_error"], version["params"], version["step"]) == (0.5, 75_002, 2)
    assert model["versions"][1]["test_error"] == 0.6
    assert len(version["sha256"]) == 64
    assert [(a["alias"], a["version"]) for a in model["aliases"]] == [("production", 1)]
    assert client.get("/api/v1/registry/digits-net").json() == model

    refused = client.delete("/api/v1/registry/digits-net/versions/1")
    assert refused.status_code == 409
    assert "production" in refused.json()["error"]["message"]
    assert (
        client.put("/api/v1/registry/digits-net/aliases/production", json={"version": 2}).json()[
            "version"
        ]
        == 2
    )
    assert client.delete("/api/v1/registry/digits-net/versions/1").status_code == 204
    assert client.delete("/api/v1/registry/digits-net/aliases/production").status_code == 204
    assert client.delete("/api/v1/registry/digits-net/versions/2").status_code == 204
    assert client.get("/api/v1/registry/digits-net").json()["versions"] == []


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/api/v1/registry/x/versions", {"job": str(uuid.uuid4())}, 422, "not a train job"),
        ("/api/v1/registry/bad name!/versions", None, 422, "must match"),
        ("/api/v1/registry/nobody/aliases/prod", {"version": 1}, 404, "not registered"),
        ("/api/v1/registry/x/versions", {"job": "nope"}, 422, "job"),
    ],
)
def test_registry_errors_use_the_shared_shape(
    client: TestClient,
    job_id: uuid.UUID,
    path: str,
    body: dict[str, str] | None,
    status: int,
    message: str,
) -> None:
    method = client.put if "aliases" in path else client.post
    answer = method(path, json=body or {"job": str(job_id)})
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]["message"]


def test_a_job_that_has_not_succeeded_does_not_register(
    client: TestClient, settings: Settings
) -> None:
    queued = new_job(settings.database_url)
    answer = client.post("/api/v1/registry/x/versions", json={"job": str(queued)})
    assert answer.status_code == 409
    assert "queued" in answer.json()["error"]["message"]


def test_the_list_pages_through_models_in_name_order_and_filters_by_name(
    client: TestClient, job_id: uuid.UUID
) -> None:
    names = [f"paged-{letter}" for letter in "edcba"]
    for name in names:
        answer = client.post(f"/api/v1/registry/{name}/versions", json={"job": str(job_id)})
        assert answer.status_code == 201, answer.text
    client.put("/api/v1/registry/paged-c/aliases/live", json={"version": 1})
    seen, cursor, pages = [], None, 0
    while True:
        params = {"q": "PAGED-", "limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get("/api/v1/registry", params=params).json()
        seen += page["items"]
        pages += 1
        if (cursor := page["next_cursor"]) is None:
            break
    assert [m["name"] for m in seen] == sorted(names)
    assert pages == 3
    # Each model carries its own versions and aliases, not another's.
    by_name = {m["name"]: m for m in seen}
    assert [a["alias"] for a in by_name["paged-c"]["aliases"]] == ["live"]
    assert all(not by_name[n]["aliases"] for n in names if n != "paged-c")
    assert all([v["version"] for v in m["versions"]] == [1] for m in seen)
    # `q` is text, not a pattern: a % or _ matches only itself.
    assert client.get("/api/v1/registry", params={"q": "paged%"}).json()["items"] == []
    assert client.get("/api/v1/registry", params={"limit": 0}).status_code == 422


def test_scopes(anonymous: TestClient, settings: Settings, job_id: uuid.UUID) -> None:
    reader = {"Authorization": f"Bearer {make_key(settings.database_url, 'read')}"}
    body = {"job": str(job_id)}
    assert anonymous.post("/api/v1/registry/m/versions", json=body).status_code == 401
    refused = anonymous.post("/api/v1/registry/m/versions", json=body, headers=reader)
    assert refused.status_code == 403
    assert "'train' scope" in refused.json()["error"]["message"]
    assert anonymous.get("/api/v1/registry", headers=reader).status_code == 200


@pytest.mark.parametrize("version", ["99999999999999999999", "2147483648", "\u0661"])
def test_a_reference_past_any_version_is_a_4xx(
    client: TestClient, job_id: uuid.UUID, version: str
) -> None:
    made = client.post("/api/v1/registry/far-net/versions", json={"job": str(job_id)})
    assert made.status_code in (200, 201), made.text
    spec = {"kind": "predict", "model": f"far-net/{version}", "dataset": {"name": "digits"}}
    answer = client.post("/api/v1/jobs", json=spec)
    assert answer.status_code == 422, answer.text
    assert "far-net" in answer.json()["error"]["message"]
