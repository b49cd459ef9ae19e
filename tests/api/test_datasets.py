"""GET /datasets and uploads: unpacked safely, size-limited, usable as an imagefolder job."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import redis
from fastapi.testclient import TestClient

from core.queue import QUEUE
from core.settings import Settings
from tests import images
from training.datasets import load_dataset
from training.specs import ImageFolderSpec

DATASETS = "/api/v1/datasets"


def _zip(names: list[str]) -> bytes:
    """A zip archive holding a small PNG under each name."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for index, name in enumerate(names):
            archive.writestr(name, images.flat_png((20 * index,) * 3))
    return buffer.getvalue()


def _files_under(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()] if folder.exists() else []


def test_datasets_say_what_is_here_and_what_is_needed(client: TestClient) -> None:
    found = {row["name"]: row for row in client.get(DATASETS).json()}
    assert found["digits"]["available"] is True
    assert found["cifar10"]["available"] is False
    assert "cifar-10-python.tar.gz" in found["cifar10"]["needs"]


def test_datasets_name_places_relative_to_the_data_folder_never_server_paths(
    client: TestClient, settings: Settings
) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    release = settings.data_dir / "cifar-100-python.tar.gz"
    release.touch()
    try:
        listed = client.get(DATASETS).json()
    finally:
        release.unlink()
    found = {row["name"]: row for row in listed}
    assert found["cifar100"]["location"] == "cifar-100-python.tar.gz"
    assert found["cifar10"]["location"] is None
    assert found["cifar10"]["needs"].endswith("in DATA_DIR, or enable downloads")
    assert "files in DATA_DIR/mnist," in found["mnist"]["needs"]
    assert "under DATA_DIR" in found["imagefolder"]["needs"]
    assert str(settings.data_dir) not in str(listed)


def test_an_uploaded_archive_is_a_dataset_path_jobs_can_use(
    client: TestClient, settings: Settings, queue: redis.Redis
) -> None:
    names = [f"shapes/{label}/{i}.png" for label in ("dark", "light") for i in range(3)]
    response = client.post(DATASETS, files={"file": ("shapes.zip", _zip(names), "application/zip")})
    assert response.status_code == 201, response.text
    upload = response.json()
    assert upload["name"] == "imagefolder"
    assert upload["files"] == 6
    spec = ImageFolderSpec(name="imagefolder", path=upload["path"], validation=0)
    loaded = load_dataset(spec, data_root=settings.data_dir)
    assert loaded.info.classes == ("dark", "light")
    job = {"kind": "train", "model": {"name": "resnet20"}, "dataset": spec.model_dump()}
    assert client.post("/api/v1/jobs", json=job).status_code == 202
    assert queue.llen(QUEUE) == 1


def test_an_archive_reaching_outside_is_refused_and_nothing_written(
    client: TestClient, settings: Settings
) -> None:
    before = _files_under(settings.data_dir)
    archive = _zip(["cats/1.png", "../x.png"])
    response = client.post(DATASETS, files={"file": ("evil.zip", archive, "application/zip")})
    assert response.status_code == 422
    error = response.json()["error"]
    assert "'..'" in error["message"]
    assert error["details"][0]["loc"] == ["body", "file"]
    assert str(settings.data_dir) not in error["message"]
    assert _files_under(settings.data_dir) == before
    assert not (settings.data_dir.parent / "x.png").exists()


def test_a_file_that_is_no_archive_is_refused(client: TestClient) -> None:
    response = client.post(DATASETS, files={"file": ("notes.txt", b"hello", "text/plain")})
    assert response.status_code == 422
    assert "is not a .zip/.tar/.tar.gz/.tgz archive" in response.json()["error"]["message"]


def test_an_upload_over_the_limit_is_413_declared_or_streamed(
    client: TestClient, settings: Settings
) -> None:
    before = _files_under(settings.data_dir)
    big = _zip([f"a/{i}.png" for i in range(3)]) + bytes(settings.max_upload_bytes)
    declared = client.post(DATASETS, files={"file": ("big.zip", big, "application/zip")})
    assert declared.status_code == 413
    assert declared.json()["error"]["code"] == "too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b"--b\r\nContent-Disposition: form-data; name=file; filename=big.zip\r\n\r\n"
        yield from (bytes(16 * 1024) for _ in range(8))

    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    streamed = client.post(DATASETS, content=chunks(), headers=headers)
    assert streamed.status_code == 413
    assert "65,536 bytes" in streamed.json()["error"]["message"]
    assert _files_under(settings.data_dir) == before
