"""Uploads in an S3 bucket (a real moto server): the API keeps the archive as an object, a
worker machine with a data folder of its own unpacks it from there, and deleting the upload
deletes its objects."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core import uploads
from core.settings import Settings
from core.storage import StoreUnavailableError
from tests.api.test_datasets import _zip
from tests.helpers import make_key
from tests.services import free_port, on_bucket
from training.datasets import load_dataset
from training.specs import ImageFolderSpec

DATASETS = "/api/v1/datasets"
BUCKET = "resnet-test-uploads"


@pytest.fixture
def api(settings: Settings, s3_url: str, tmp_path: Path) -> Iterator[TestClient]:
    """A client of an app on the bucket, with a train key."""
    key = make_key(settings.database_url, "read", "train")
    app = create_app(on_bucket(settings, s3_url, BUCKET, tmp_path / "api"))
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


def listed(s3_url: str, prefix: str) -> list[str]:
    """The bucket's keys under `prefix`, as list_objects_v2 answers."""
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=s3_url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    answer = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"] for item in answer.get("Contents", [])]


def test_an_upload_is_unpacked_from_the_bucket_on_a_worker_and_deleted_with_it(
    api: TestClient, settings: Settings, s3_url: str, tmp_path: Path
) -> None:
    names = [f"shapes/{label}/{i}.png" for label in ("dark", "light") for i in range(3)]
    archive = _zip(names)
    upload_id = hashlib.sha256(archive).hexdigest()
    sent = api.post(DATASETS, files={"file": ("shapes.zip", archive, "application/zip")})
    assert sent.status_code == 201, sent.text
    path = sent.json()["path"]
    assert listed(s3_url, f"uploads/{upload_id}/") == [f"uploads/{upload_id}/archive.zip"]

    # Another machine: it shares no folder with the API.
    worker = on_bucket(settings, s3_url, BUCKET, tmp_path / "worker")
    tree = uploads.materialize(worker, {"name": "imagefolder", "path": path})
    assert tree == worker.data_dir / path
    spec = ImageFolderSpec(name="imagefolder", path=path, validation=0)
    assert load_dataset(spec, data_root=worker.data_dir).info.classes == ("dark", "light")
    assert uploads.materialize(worker, {"name": "imagefolder", "path": path}) == tree  # kept

    assert api.delete(f"{DATASETS}/uploads/{upload_id}").status_code == 204
    assert listed(s3_url, "uploads/") == []


def test_a_worker_without_the_store_cannot_unpack_an_upload(
    settings: Settings, tmp_path: Path
) -> None:
    dead = on_bucket(settings, f"http://127.0.0.1:{free_port()}", BUCKET, tmp_path)
    with pytest.raises(StoreUnavailableError):
        uploads.materialize(dead, {"name": "imagefolder", "path": "uploads/" + "a" * 64})
    # Datasets that are no upload, and the local store, need nothing fetched.
    assert uploads.materialize(dead, {"name": "digits"}) is None
    assert uploads.materialize(settings, {"path": "uploads/" + "a" * 64}) is None


def test_an_upload_the_store_cannot_take_is_a_503_and_nothing_is_kept(
    settings: Settings, tmp_path: Path
) -> None:
    dead = on_bucket(settings, f"http://127.0.0.1:{free_port()}", BUCKET, tmp_path)
    key = make_key(settings.database_url, "read", "train")
    names = [f"dots/{label}/{i}.png" for label in ("few", "many") for i in range(2)]
    archive = _zip(names)
    with TestClient(create_app(dead), headers={"Authorization": f"Bearer {key}"}) as api:
        sent = api.post(DATASETS, files={"file": ("dots.zip", archive, "application/zip")})
        assert sent.status_code == 503, sent.text
        assert sent.headers["Retry-After"] == "5"
        listed_rows = api.get(f"{DATASETS}/uploads").json()
    upload_id = hashlib.sha256(archive).hexdigest()
    assert upload_id not in {row["id"] for row in listed_rows}
    assert not (uploads.folder(dead) / upload_id).exists()
