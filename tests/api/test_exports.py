"""Checkpoint downloads and a version's exports over HTTP: streamed bytes with their sha256,
each format checked, stored, listed, downloaded and loaded back, and what is refused."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.app import create_app
from core import artifacts, storage
from core.db.session import session_scope
from core.db.tables import Checkpoint, ModelExport
from core.settings import Settings
from tests.helpers import make_key, trained_job
from tests.services import free_port, on_bucket
from training import export
from training.runs import load_trained_model

VERSION = "/api/v1/registry/exported/versions/1"
TORCHSCRIPT = {"format": "torchscript"}  # the quickest export


@pytest.fixture(scope="module")
def anonymous(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def job_id(settings: Settings) -> uuid.UUID:
    return trained_job(settings)


@pytest.fixture(scope="module")
def registered(client: TestClient, job_id: uuid.UUID) -> str:
    """Version 1 of `exported`: the job's best checkpoint, registered by `client`'s key."""
    answer = client.post("/api/v1/registry/exported/versions", json={"job": str(job_id)})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["sha256"])


@pytest.fixture(scope="module")
def owner_only(settings: Settings) -> Iterator[TestClient]:
    """Another API on the database, whose reads keep to the caller's own rows, with a key
    that owns nothing."""
    strict = settings.model_copy(update={"reads_owner_only": True})
    key = make_key(settings.database_url, "read", "train")
    with TestClient(create_app(strict), headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


def _checked_download(answer: httpx.Response, sha256: str) -> bytes:
    """The body of a download, once its headers name its size and the recorded sha256."""
    assert answer.status_code == 200, answer.text
    body = answer.content
    assert answer.headers["x-checksum-sha256"] == sha256 == hashlib.sha256(body).hexdigest()
    digest = base64.b64encode(hashlib.sha256(body).digest()).decode()
    assert answer.headers["repr-digest"] == f"sha-256=:{digest}:"
    assert int(answer.headers["content-length"]) == len(body)
    assert answer.headers["content-disposition"].startswith("attachment; filename=")
    return body


def test_a_jobs_checkpoints_download_as_stored(
    client: TestClient, job_id: uuid.UUID, settings: Settings
) -> None:
    listed = client.get(f"/api/v1/jobs/{job_id}/checkpoints").json()
    by_step = {row["step"]: row for row in listed}
    with session_scope(settings.database_url) as session:
        stored = {
            row.step: Path(row.path)
            for row in session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id))
        }
    for which, step in (("best", 2), ("last", 2), ("1", 1)):
        answer = client.get(f"/api/v1/jobs/{job_id}/checkpoints/{which}/file")
        body = _checked_download(answer, by_step[step]["sha256"])
        assert body == stored[step].read_bytes()
        assert f"step-{step}.pt" in answer.headers["content-disposition"]
    missing = client.get(f"/api/v1/jobs/{job_id}/checkpoints/7/file")
    assert missing.status_code == 404
    assert "no step 7 checkpoint" in missing.json()["error"]["message"]
    assert client.get(f"/api/v1/jobs/{uuid.uuid4()}/checkpoints/best/file").status_code == 404
    assert client.get(f"/api/v1/jobs/{job_id}/checkpoints/worst/file").status_code == 422


def test_a_versions_checkpoint_downloads_and_is_hidden_from_other_owners(
    client: TestClient, owner_only: TestClient, job_id: uuid.UUID, registered: str
) -> None:
    answer = client.get(f"{VERSION}/checkpoint")
    body = _checked_download(answer, registered)
    assert "exported-v1-step-2.pt" in answer.headers["content-disposition"]
    assert client.get(f"/api/v1/jobs/{job_id}/checkpoints/best/file").content == body
    assert client.get("/api/v1/registry/exported/versions/9/checkpoint").status_code == 404
    assert client.get("/api/v1/registry/nobody/versions/1/checkpoint").status_code == 404
    # Another key, where reads keep to their owner: as if neither existed.
    assert owner_only.get(f"{VERSION}/checkpoint").status_code == 404
    assert owner_only.get(f"/api/v1/jobs/{job_id}/checkpoints/best/file").status_code == 404
    assert owner_only.get(f"{VERSION}/exports").status_code == 404


@pytest.mark.parametrize("fmt", export.FLOAT_FORMATS)
def test_each_format_is_checked_stored_listed_downloaded_and_loads_back(
    client: TestClient,
    settings: Settings,
    job_id: uuid.UUID,
    registered: str,
    fmt: export.Format,
    tmp_path: Path,
) -> None:
    made = client.post(f"{VERSION}/exports", json={"format": fmt})
    assert made.status_code == 201, made.text
    row = made.json()
    assert row["max_abs_diff"] <= row["tolerance"] == export.TOLERANCE
    assert row["details"]["softmax"] is True
    assert row["details"]["batches_checked"] == [8, 1]
    again = client.post(f"{VERSION}/exports", json={"format": fmt})
    assert (again.status_code, again.json()) == (200, row)
    assert fmt in [found["format"] for found in client.get(f"{VERSION}/exports").json()]
    assert client.get(f"{VERSION}/exports/{fmt}").json() == row

    body = _checked_download(client.get(row["file"]), row["sha256"])
    assert len(body) == row["bytes"]
    saved = tmp_path / f"model{export.SUFFIXES[fmt]}"
    saved.write_bytes(body)
    # The downloaded file, loaded as a user would, gives the eager net's probabilities.
    with session_scope(settings.database_url) as session:
        checkpoint = artifacts.find_checkpoint(session=session, job_id=job_id, which="best")
        assert checkpoint is not None
        path = Path(checkpoint.path)
    trained = load_trained_model(path, sha256=registered)
    model, info = trained.model, trained.info
    batch = export.check_batch(info)
    net = export.served_net(model)
    loaded = export.load(fmt, saved)
    assert export.max_abs_diff(loaded, net, batch) <= export.TOLERANCE
    with torch.inference_mode():
        assert torch.allclose(loaded(batch).sum(1), torch.ones(len(batch)))  # probabilities
    # The export says how images become its input: the checkpoint's declared preprocessing.
    assert row["details"]["preprocessing"] == trained.preprocessing.to_record()
    if fmt == "onnx":
        metadata = {entry.key: entry.value for entry in onnx.load(str(saved)).metadata_props}
        assert json.loads(metadata["preprocessing"]) == trained.preprocessing.to_record()
        assert json.loads(metadata["classes"]) == list(info.classes)


def test_a_tampered_export_is_refused(
    client: TestClient, settings: Settings, registered: str
) -> None:
    row = client.post(f"{VERSION}/exports", json={"format": "torchscript"}).json()
    with session_scope(settings.database_url) as session:
        stored = session.query(ModelExport).filter_by(sha256=row["sha256"]).one()
        path = Path(stored.path)
    original = path.read_bytes()
    try:
        path.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        refused = client.get(row["file"])
        assert refused.status_code == 409
        assert "changed or damaged" in refused.json()["error"]["message"]
    finally:
        path.write_bytes(original)
    assert client.get(row["file"]).status_code == 200


def test_an_export_over_the_bound_is_not_kept(
    client: TestClient, settings: Settings, job_id: uuid.UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.post("/api/v1/registry/loose/versions", json={"job": str(job_id)})
    exported = artifacts.job_dir(settings, job_id) / "exports"
    before = sorted(exported.rglob("*"))
    # The export's process checks against the API's bound: one that no difference is within.
    monkeypatch.setattr(export, "TOLERANCE", -1.0)
    body = {"format": "torchscript"}
    answer = client.post("/api/v1/registry/loose/versions/1/exports", json=body)
    assert answer.status_code == 500, answer.text
    assert ", over the bound of -1; it was not kept" in answer.json()["error"]["message"]
    assert client.get("/api/v1/registry/loose/versions/1/exports").json() == []
    assert sorted(exported.rglob("*")) == before


def test_only_the_models_owner_exports_and_deleting_a_version_deletes_its_exports(
    client: TestClient, anonymous: TestClient, settings: Settings, job_id: uuid.UUID
) -> None:
    client.post("/api/v1/registry/doomed/versions", json={"job": str(job_id)})
    other = {"Authorization": f"Bearer {make_key(settings.database_url, 'read', 'train')}"}
    body = {"format": "torchscript"}
    refused = anonymous.post("/api/v1/registry/doomed/versions/1/exports", json=body, headers=other)
    assert refused.status_code == 403, refused.text
    made = client.post("/api/v1/registry/doomed/versions/1/exports", json=body)
    assert made.status_code == 201, made.text
    with session_scope(settings.database_url) as session:
        # The newest of the rows with its sha256: each process exports one net byte for byte.
        rows = session.query(ModelExport).filter_by(sha256=made.json()["sha256"])
        newest = rows.order_by(ModelExport.id.desc()).first()
        assert newest is not None
        path = Path(newest.path)
    assert path.is_file()
    assert client.delete("/api/v1/registry/doomed/versions/1").status_code == 204
    assert not path.exists()
    assert client.get(made.json()["file"]).status_code == 404


def test_an_object_store_that_cannot_be_reached_is_a_503(
    client: TestClient,
    settings: Settings,
    job_id: uuid.UUID,
    registered: str,
    tmp_path: Path,
) -> None:
    kept = client.post(f"{VERSION}/exports", json={"format": "torchscript"}).json()
    client.post("/api/v1/registry/unstored/versions", json={"job": str(job_id)})
    unstored = "/api/v1/registry/unstored/versions/1"
    dead = on_bucket(settings, f"http://127.0.0.1:{free_port()}", "exports", tmp_path)
    key = make_key(settings.database_url, "admin")
    with TestClient(create_app(dead), headers={"Authorization": f"Bearer {key}"}) as api:
        made = api.post(f"{unstored}/exports", json={"format": "torchscript"})
        assert made.status_code == 503, made.text
        assert made.headers["retry-after"]
        assert api.get(f"{unstored}/exports").json() == []
        with session_scope(settings.database_url) as session:
            row = session.query(ModelExport).filter_by(sha256=kept["sha256"]).one()
            path, row.path = row.path, "jobs/elsewhere/exports/1/model.torchscript.pt"  # a key
        try:
            fetched = api.get(kept["file"])
        finally:
            with session_scope(settings.database_url) as session:
                session.query(ModelExport).filter_by(sha256=kept["sha256"]).one().path = path
    assert fetched.status_code == 503, fetched.text
    assert "artifact store is unavailable" in fetched.json()["error"]["message"]


def test_exports_live_in_the_bucket_with_an_object_store(
    client: TestClient,
    settings: Settings,
    job_id: uuid.UUID,
    s3_url: str,
    tmp_path: Path,
) -> None:
    on_s3 = on_bucket(settings, s3_url, "exports", tmp_path)
    client.post("/api/v1/registry/bucketed/versions", json={"job": str(job_id)})
    key = make_key(settings.database_url, "admin")
    with TestClient(create_app(on_s3), headers={"Authorization": f"Bearer {key}"}) as api:
        made = api.post("/api/v1/registry/bucketed/versions/1/exports", json=TORCHSCRIPT)
        assert made.status_code == 201, made.text
        stored = storage.store_for(on_s3)
        (object_key,) = stored.keys(f"jobs/{job_id}/exports/")
        with session_scope(settings.database_url) as session:
            assert session.query(ModelExport).filter_by(path=object_key).count() == 1
        _checked_download(api.get(made.json()["file"]), made.json()["sha256"])
        assert api.delete("/api/v1/registry/bucketed/versions/1").status_code == 204
        assert stored.keys(f"jobs/{job_id}/exports/") == []
