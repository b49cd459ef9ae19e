"""Rollouts over HTTP: an alias's weights, stickiness and shadow set in one request, the
version that served each answer (/api/v1/predict and /v2), promotion, the shadow's
figures and /metrics, and the registry's history with who made each change."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from tests import images
from tests.helpers import TINY, key_of, trained_job, wait_for

PNG = images.flat_png((20, 200, 40))


@pytest.fixture(scope="module")
def model(settings: Settings, admin: TestClient) -> str:
    """A model of three versions: the best and last checkpoints of one job, another job's best."""
    seeded = {**TINY, "recipe": {**TINY["recipe"], "seed": 1}}  # type: ignore[dict-item]
    job, other = trained_job(settings), trained_job(settings, seeded)
    name = f"roll-{uuid.uuid4().hex[:6]}"
    for made, checkpoint in ((job, "best"), (job, "last"), (other, "best")):
        body = {"job": str(made), "checkpoint": checkpoint}
        answer = admin.post(f"/api/v1/registry/{name}/versions", json=body)
        assert answer.status_code == 201, answer.text
    return name


def _predict(client: TestClient, ref: str, **headers: str) -> tuple[str, int]:
    answer = client.post(
        "/api/v1/predict", params={"model": ref}, files={"files": ("a.png", PNG)}, headers=headers
    )
    assert answer.status_code == 200, answer.text
    return answer.headers["x-model-version"], answer.json()["model"]["version"]


def test_weights_sticky_and_shadow_are_set_in_one_request(admin: TestClient, model: str) -> None:
    body = {"weights": {"1": 50, "2": 50}, "sticky": True, "shadow": {"version": 3}}
    answer = admin.put(f"/api/v1/registry/{model}/aliases/production", json=body)
    assert answer.status_code == 200, answer.text
    alias = answer.json()
    assert alias["weights"] == {"1": 50, "2": 50}
    assert (alias["version"], alias["sticky"]) == (1, True)
    assert alias["shadow"] == {"version": 3, "percent": 100}
    listed = admin.get(f"/api/v1/registry/{model}").json()["aliases"]
    assert [(a["alias"], a["weights"], a["shadow"]) for a in listed] == [
        ("production", {"1": 50, "2": 50}, {"version": 3, "percent": 100})
    ]
    # Every answer names its version, in its header and its JSON, and never the shadow.
    served = Counter(_predict(admin, f"{model}@production") for _ in range(6))
    assert {header for header, _ in served} <= {f"{model}/1", f"{model}/2"}
    assert all(header == f"{model}/{version}" for header, version in served)
    # Sticky: an admin key keeps its version; sessions without a key split by their header.
    assert len(served) == 1
    sessions = {_predict(admin, f"{model}@production", **{"X-Session-Key": "s1"})[1]}
    assert len(sessions) == 1
    infer = {
        "inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [1, 8, 8, 3],
                    "data": [0] * 192}]
    }  # fmt: skip
    v2 = admin.post(f"/v2/models/{model}@production/infer", json=infer)
    assert v2.status_code == 200, v2.text
    assert v2.headers["x-model-version"] == f"{model}/{v2.json()['model_version']}"
    assert v2.json()["model_version"] in {"1", "2"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"weights": {"1": 90, "9": 10}}, 404, "has no version 9"),
        ({"weights": {"1": 90, "2": 0}}, 422, "the weight of version 2 is 0"),
        ({"weights": {str(n): 1 for n in range(1, 12)}}, 422, "between 1 and 10"),
        ({"version": 1, "shadow": {"version": 1}}, 422, "serves through the alias already"),
        ({"version": 1, "shadow": {"version": 2, "percent": 101}}, 422, "from 1 to 100"),
        ({}, 422, "either version or weights"),
    ],
)
def test_a_wrong_alias_is_refused_with_what_to_change(
    admin: TestClient, model: str, body: dict[str, object], status: int, message: str
) -> None:
    answer = admin.put(f"/api/v1/registry/{model}/aliases/staging", json=body)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]["message"]


def test_promotion_and_the_history_say_who_did_what(
    settings: Settings, anonymous: TestClient, model: str
) -> None:
    owner = key_of(settings.database_url, "read", "train", "predict")
    name = f"{model}-h"
    client, h = anonymous, owner.headers
    made = client.get(f"/api/v1/registry/{model}", headers=h).json()["versions"]
    for version in made[:2]:  # another model of the same jobs (no one's), owned by this key
        job = {"job": version["job_id"], "checkpoint": version["checkpoint"]}
        answer = client.post(f"/api/v1/registry/{name}/versions", json=job, headers=h)
        assert answer.status_code == 201, answer.text
    path = f"/api/v1/registry/{name}/aliases/production"
    assert client.put(path, json={"weights": {"1": 90, "2": 10}}, headers=h).status_code == 200
    refused = client.post(f"{path}/promote", json={"version": 7}, headers=h)
    assert refused.status_code == 409, refused.text
    promoted = client.post(f"{path}/promote", json={"version": 2}, headers=h)
    assert promoted.status_code == 200, promoted.text
    assert (promoted.json()["weights"], promoted.json()["shadow"]) == ({"2": 100}, None)
    history = client.get(f"/api/v1/registry/{name}/history", headers=h).json()
    assert [entry["action"] for entry in history][:2] == ["alias.promoted", "alias.created"]
    assert history[0]["before"]["weights"] == {"1": 90, "2": 10}
    assert {entry["key_id"] for entry in history} == {owner.id}


def test_the_shadow_figures_and_series(admin: TestClient, model: str) -> None:
    body = {"version": 1, "shadow": {"version": 3, "percent": 100}}
    assert admin.put(f"/api/v1/registry/{model}/aliases/canary", json=body).status_code == 200
    for _ in range(5):
        assert _predict(admin, f"{model}@canary")[0] == f"{model}/1"

    def figures() -> list[dict[str, Any]] | None:
        found = admin.get(f"/api/v1/registry/{model}/shadow").json()
        mine = [f for f in found if f["version"] == 1]
        return mine if mine and mine[0]["images"] + mine[0]["dropped"] >= 5 else None

    # The copies are compared off the requests' path, after their answers.
    (figure,) = wait_for(figures, 60, "the shadow's comparisons", every=0.05)
    assert figure["shadow"] == 3
    assert figure["images"] >= 1
    assert 0 <= figure["agreement"] <= 1
    metrics = admin.get("/api/v1/metrics").text
    assert f'resnet_shadow_images_total{{model="{model}/1",shadow="{model}/3"}}' in metrics
    assert f'resnet_rollout_requests_total{{alias="production",model="{model}"' in metrics
