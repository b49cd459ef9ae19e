"""Artifact usage over HTTP: the bytes an owner's jobs and exports take as stored, every
owner's for an admin, and the train jobs refused when their checkpoints cannot fit."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from api.app import create_app
from core import artifacts
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.helpers import TRAIN, make_key, trained_job
from tests.services import file_bytes

BUDGET = 8 * 2**20
MIB = 2**20
RESNET20_DIGITS_CHECKPOINT = 2_155_472  # the estimate: weights and momentum, float32


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """The module's settings with an artifact budget of 8 MiB per owner."""
    return settings.model_copy(update={"max_artifact_bytes_per_owner": BUDGET})


@pytest.fixture
def fresh(anonymous: TestClient, settings: Settings) -> Iterator[TestClient]:
    """A client with a read + train key of its own, which keeps nothing yet."""
    key = make_key(settings.database_url, "read", "train")
    with TestClient(anonymous.app, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


def _train(keep_last: int) -> dict[str, object]:
    return {**TRAIN, "recipe": {"iterations": 100, "checkpoint_every": 1, "keep_last": keep_last}}


def test_a_train_job_whose_kept_checkpoints_cannot_fit_is_refused(
    fresh: TestClient, queue: object
) -> None:
    refused = fresh.post("/api/v1/jobs", json=_train(keep_last=100))

    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    assert "recipe.keep_last 100 checkpoints of resnet20" in message
    assert f"an estimated {RESNET20_DIGITS_CHECKPOINT / MIB:.2f} MiB each" in message
    assert "MAX_ARTIFACT_BYTES_PER_OWNER is 8.00 MiB per owner" in message
    assert "this owner keeps 0.00 MiB" in message
    # Three fit in the budget: nothing else is held against the spec.
    assert fresh.post("/api/v1/jobs", json=_train(keep_last=3)).status_code == 202


def test_usage_is_the_bytes_stored_per_owner_exports_included(
    fresh: TestClient, admin: TestClient, client: TestClient, settings: Settings, queue: object
) -> None:
    owner = fresh.get("/api/v1/usage").json()["owner"]
    job_id = trained_job(settings)
    with session_scope(settings.database_url) as session:  # the fresh key's job, not measured
        session.execute(update(Job).where(Job.id == job_id).values(owner_key_id=uuid.UUID(owner)))
    folder = artifacts.job_dir(settings, job_id)

    usage = fresh.get("/api/v1/usage").json()
    assert usage["job_bytes"] == file_bytes(folder) > 3 * 600_000  # three checkpoint files at least
    assert (usage["jobs"], usage["export_bytes"], usage["limit_bytes"]) == (1, 0, BUDGET)
    assert usage["left_bytes"] == BUDGET - usage["bytes"]

    name = f"usage-{job_id.hex[:8]}"
    made = fresh.post(f"/api/v1/registry/{name}/versions", json={"job": str(job_id)})
    assert made.status_code == 201, made.text
    exported = fresh.post(
        f"/api/v1/registry/{name}/versions/1/exports", json={"format": "torchscript"}
    )
    assert exported.status_code == 201, exported.text
    after = fresh.get("/api/v1/usage").json()
    assert after["job_bytes"] == usage["job_bytes"]  # the export counts apart
    assert after["export_bytes"] == exported.json()["bytes"] == file_bytes(folder / "exports") > 0
    assert after["bytes"] == file_bytes(folder)

    owners = admin.get("/api/v1/usage/owners")
    assert owners.status_code == 200, owners.text
    mine = [entry for entry in owners.json() if entry["owner"] == owner]
    assert mine == [{**after, "name": "test"}]
    assert client.get("/api/v1/usage/owners").status_code == 403

    # What it keeps now leaves less than three resnet20 checkpoints: refused, naming it.
    refused = fresh.post("/api/v1/jobs", json=_train(keep_last=3))
    assert refused.status_code == 422, refused.text
    assert f"this owner keeps {after['bytes'] / MIB:,.2f} MiB" in refused.json()["error"]["message"]


def test_a_new_export_is_refused_once_its_owner_keeps_the_whole_budget(
    fresh: TestClient, settings: Settings
) -> None:
    owner = fresh.get("/api/v1/usage").json()["owner"]
    job_id = trained_job(settings)
    with session_scope(settings.database_url) as session:
        session.execute(update(Job).where(Job.id == job_id).values(owner_key_id=uuid.UUID(owner)))
    name = f"full-{job_id.hex[:8]}"
    assert fresh.post(f"/api/v1/registry/{name}/versions", json={"job": str(job_id)}).is_success
    exports = f"/api/v1/registry/{name}/versions/1/exports"
    assert fresh.post(exports, json={"format": "torchscript"}).status_code == 201

    tight = settings.model_copy(update={"max_artifact_bytes_per_owner": MIB})  # below one job
    key = fresh.headers["Authorization"]
    with TestClient(create_app(tight), headers={"Authorization": key}) as full:
        refused = full.post(exports, json={"format": "onnx"})
        assert refused.status_code == 422, refused.text
        assert "no room is left" in refused.json()["error"]["message"]
        assert "MAX_ARTIFACT_BYTES_PER_OWNER is 1.00 MiB" in refused.json()["error"]["message"]
        # What is stored is still answered as it is.
        assert full.post(exports, json={"format": "torchscript"}).status_code == 200
        formats = [row["format"] for row in full.get(exports).json()]
    assert formats == ["torchscript"]
