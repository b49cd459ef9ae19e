"""What a job's dataset path reaches, over HTTP on Postgres with several keys and
READS_OWNER_ONLY: every spelling of a path is resolved in the data dir (links followed), a
path that is or holds the uploads folder is refused for every kind, and a path inside an
upload only for its owner (or an admin key); the owner's own runs read it as before."""

from __future__ import annotations

import csv
import io
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from core import artifacts
from core.db.session import session_scope
from core.db.tables import Job
from core.queue import QUEUE
from core.settings import Settings
from tests import images
from tests.helpers import Key, key_of, run_job, trained_job
from training.events import RecordingSink

JOBS = "/api/v1/jobs"
DATASETS = "/api/v1/datasets"
SECRET = ("alice-cat", "alice-dog")  # the class folders of the upload another key must not read


@pytest.fixture(scope="module")
def strict(settings: Settings) -> Iterator[TestClient]:
    """The API on the module's database whose reads keep to the caller's own rows."""
    with TestClient(create_app(settings.model_copy(update={"reads_owner_only": True}))) as app:
        yield app


@pytest.fixture(scope="module")
def alice(settings: Settings) -> Key:
    return key_of(settings.database_url, "read", "train")


@pytest.fixture(scope="module")
def bob(settings: Settings) -> Key:
    return key_of(settings.database_url, "read", "train")


@pytest.fixture(scope="module")
def admin(settings: Settings) -> Key:
    return key_of(settings.database_url, "admin")


def _zip() -> bytes:
    """An ImageFolder archive: two classes of 8x8 PNGs, three each."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for shade, label in enumerate(SECRET):
            for index in range(3):
                image = images.flat_png((shade * 200, index * 40, 0))
                archive.writestr(f"pets/{label}/{index}.png", image)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def upload(strict: TestClient, alice: Key) -> str:
    """Alice's upload: its 64-hex id."""
    sent = strict.post(
        DATASETS, files={"file": ("pets.zip", _zip(), "application/zip")}, headers=alice.headers
    )
    assert sent.status_code == 201, sent.text
    return str(sent.json()["path"]).removeprefix("uploads/")


def _owned_job(settings: Settings, owner: Key) -> uuid.UUID:
    """A succeeded train job with real checkpoints (10 classes of 8x8 images), of `owner`."""
    job_id = trained_job(settings)
    with session_scope(settings.database_url) as session:
        row = session.get(Job, job_id)
        assert row is not None
        row.owner_key_id = uuid.UUID(owner.id)
    return job_id


@pytest.fixture(scope="module")
def bobs_model(settings: Settings, bob: Key) -> uuid.UUID:
    return _owned_job(settings, bob)


def _specs(path: str, model: uuid.UUID) -> dict[str, dict[str, Any]]:
    """A job of each kind that reads a dataset, on the ImageFolder `path`."""
    dataset = {"name": "imagefolder", "path": path, "image_size": 8}
    return {
        "train": {
            "kind": "train",
            "model": {"name": "resnet8"},
            "dataset": {**dataset, "validation": 0},
            "recipe": {"iterations": 2, "batch_size": 4},
        },
        "predict": {"kind": "predict", "model": str(model), "dataset": dataset},
        "evaluate": {"kind": "evaluate", "source_job": str(model), "dataset": dataset},
    }


def _refused(answer: Any, status: int, *words: str) -> str:
    assert answer.status_code == status, answer.text
    message = str(answer.json()["error"]["message"])
    assert all(word in message for word in words), message
    return message


def test_a_path_that_is_or_holds_the_uploads_folder_is_refused_for_every_kind(
    strict: TestClient, settings: Settings, queue: redis.Redis, upload: str, bob: Key,
    admin: Key, bobs_model: uuid.UUID,
) -> None:  # fmt: skip
    link = settings.data_dir / "everything"
    link.symlink_to(settings.data_dir / "uploads", target_is_directory=True)
    spellings = ("uploads", "uploads/", "./uploads", "uploads/.", ".", "everything")
    for path in spellings:
        for kind, spec in _specs(path, bobs_model).items():
            answer = strict.post(JOBS, json=spec, headers=bob.headers)
            _refused(answer, 422, "uploads folder", "uploads/<sha256>")
            assert answer.json()["error"]["details"][0]["loc"] == ["body", "dataset", "path"]
            assert str(settings.data_dir) not in answer.text, (kind, path)
    # Not even an admin key trains on every owner's uploads as classes at once.
    train = _specs("uploads", bobs_model)["train"]
    _refused(strict.post(JOBS, json=train, headers=admin.headers), 422, "uploads folder")
    assert queue.llen(QUEUE) == 0


def test_anothers_upload_is_refused_however_its_path_is_spelled(
    strict: TestClient, settings: Settings, queue: redis.Redis, upload: str, alice: Key,
    bob: Key, admin: Key, bobs_model: uuid.UUID,
) -> None:  # fmt: skip
    link = settings.data_dir / "alices"
    link.symlink_to(settings.data_dir / "uploads" / upload, target_is_directory=True)
    spellings = (
        f"uploads/{upload}",
        f"uploads/./{upload}",
        f"uploads//{upload}",
        f"./uploads/{upload}",
        f"uploads/{upload}/",
        f"uploads/{upload}/pets",
        f"uploads/{upload}/pets/{SECRET[0]}",
        "alices",
        "alices/pets",
    )
    for path in spellings:
        for kind, spec in _specs(path, bobs_model).items():
            answer = strict.post(JOBS, json=spec, headers=bob.headers)
            _refused(answer, 422, "does not exist")
            told = [label for label in SECRET if label in answer.text and label not in path]
            assert not told, (kind, path)
    # '..' is refused by the spec itself, whatever it would resolve to.
    for spec in _specs(f"x/../uploads/{upload}", bobs_model).values():
        _refused(strict.post(JOBS, json=spec, headers=bob.headers), 422, "'..'")
    assert queue.llen(QUEUE) == 0
    # The owner and an admin key read it under any spelling (the admin's train job here).
    alices_model = _owned_job(settings, alice)
    for path in (f"uploads/./{upload}", "alices/pets"):
        spec = _specs(path, alices_model)["predict"]
        assert strict.post(JOBS, json=spec, headers=alice.headers).status_code == 202
    train = _specs(f"uploads//{upload}", bobs_model)["train"]
    assert strict.post(JOBS, json=train, headers=admin.headers).status_code == 202


def test_the_owners_prediction_on_a_respelled_path_reads_its_files(
    strict: TestClient, settings: Settings, queue: redis.Redis, upload: str, alice: Key,
) -> None:  # fmt: skip
    model = _owned_job(settings, alice)
    spec = _specs(f"uploads//{upload}/", model)["predict"]
    answer = strict.post(JOBS, json=spec, headers=alice.headers)
    assert answer.status_code == 202, answer.text
    job_id = uuid.UUID(answer.json()["id"])

    summary = run_job(settings, job_id, RecordingSink())

    folder = artifacts.job_dir(settings, job_id)
    rows = list(csv.DictReader((folder / "predictions.csv").open()))
    assert summary["images"] == len(rows) == 2  # the test split: one image of each class
    assert {row["label"] for row in rows} == set(SECRET)


def test_a_study_of_anothers_upload_or_of_the_uploads_folder_is_refused(
    strict: TestClient, settings: Settings, queue: redis.Redis, upload: str, alice: Key, bob: Key
) -> None:
    def study(path: str) -> dict[str, Any]:
        dataset = {"name": "imagefolder", "path": path, "image_size": 8, "validation": 0}
        base = {"model": {"name": "resnet8"}, "dataset": dataset, "recipe": {"iterations": 2}}
        return {"base": base, "grid": {"model.name": ["plain8", "resnet8"]}, "seeds": 1}

    for path, words in ((f"uploads//{upload}", "does not exist"), ("./uploads", "uploads folder")):
        _refused(strict.post("/api/v1/studies", json=study(path), headers=bob.headers), 422, words)
    assert strict.get("/api/v1/studies", headers=bob.headers).json() == []
    mine = strict.post("/api/v1/studies", json=study(f"uploads/./{upload}"), headers=alice.headers)
    assert mine.status_code == 202, mine.text
