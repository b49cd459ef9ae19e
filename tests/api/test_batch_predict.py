"""Predict jobs: submission pins the model, the run writes rows per image and the confusion
matrix, and the job's artifacts list and download with their sha256."""

from __future__ import annotations

import csv
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image
from sqlalchemy import select
from typer.testing import CliRunner

from api.app import create_app
from cli.main import app
from client import Client
from core import artifacts
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.helpers import make_key, new_job, run_job, trained_job
from tests.services import on_bucket
from training import checkpoints
from training.batch_predict import CONFUSION
from training.data import TensorSplit
from training.datasets import load_dataset
from training.events import RecordingSink
from training.predictor import Predictor
from training.specs import SyntheticSpec

JOBS = "/api/v1/jobs"
SYNTHETIC = {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 24}


def _predict(**fields: Any) -> dict[str, Any]:
    return {"kind": "predict", "model": "tiny@prod", "dataset": SYNTHETIC, **fields}


@pytest.fixture(scope="module")
def model(settings: Settings, client: TestClient) -> uuid.UUID:
    """A trained job registered as `tiny` 1 (best) and 2 (last), alias `prod` at 1."""
    job_id = trained_job(settings)
    for checkpoint in ("best", "last"):
        added = client.post(
            "/api/v1/registry/tiny/versions", json={"job": str(job_id), "checkpoint": checkpoint}
        )
        assert added.status_code == 201, added.text
    assert client.put("/api/v1/registry/tiny/aliases/prod", json={"version": 1}).status_code == 200
    return job_id


@pytest.fixture(scope="module")
def owner_only(settings: Settings) -> Iterator[TestClient]:
    """The API on the same database for another key, whose reads keep to its own rows."""
    key = make_key(settings.database_url, "read", "train")
    app = create_app(settings.model_copy(update={"reads_owner_only": True}))
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as strict:
        yield strict


def _run(settings: Settings, job_id: uuid.UUID, sink: RecordingSink) -> dict[str, Any]:
    """Run a submitted predict job in this process as a worker would; its summary."""
    budgets: list[tuple[int, float]] = []
    summary = run_job(settings, job_id, sink, lambda *budget: budgets.append(budget))
    assert budgets[0][0] == summary.get("total_images", summary.get("images"))  # one per image
    return summary


def _refused(answer: Any, *words: str) -> None:
    assert answer.status_code == 422, answer.text
    message = answer.json()["error"]["message"]
    assert all(word in message for word in words), message


def test_a_submission_names_a_readable_model_and_dataset(
    settings: Settings, client: TestClient, owner_only: TestClient, model: uuid.UUID
) -> None:
    queued = new_job(settings.database_url)
    _refused(client.post(JOBS, json=_predict(model="nope")), "model 'nope' is not registered")
    _refused(client.post(JOBS, json=_predict(model="tiny@canary")), "no alias 'canary'")
    _refused(client.post(JOBS, json=_predict(model="bad ref!")), "must be a job id")
    _refused(client.post(JOBS, json=_predict(model=str(queued))), "queued train job")
    upload = {"name": "imagefolder", "path": f"uploads/{'a' * 64}"}
    _refused(client.post(JOBS, json=_predict(dataset=upload)), "upload", "does not exist")
    _refused(client.post(JOBS, json=_predict(top_k=0)), "top_k")
    # Another key that reads only its own rows is told the model is not there.
    _refused(owner_only.post(JOBS, json=_predict()), "model 'tiny' is not registered")


def test_a_predict_job_writes_a_row_per_image_with_the_pinned_model(
    settings: Settings, client: TestClient, queue: Any, model: uuid.UUID
) -> None:
    sent = _predict(format="both", top_k=3, batch_size=10)
    answer = client.post(JOBS, json=sent, headers={"Idempotency-Key": "predict-1"})
    assert answer.status_code == 202, answer.text
    job = answer.json()
    pinned = job["spec"]["resolved"]
    assert (pinned["model"], pinned["version"], job["source_job"]) == ("tiny", 1, str(model))
    again = client.post(JOBS, json=sent, headers={"Idempotency-Key": "predict-1"})
    assert (again.status_code, again.json()["id"]) == (200, job["id"])
    # Moving the alias after submission changes nothing about what runs.
    assert client.put("/api/v1/registry/tiny/aliases/prod", json={"version": 2}).status_code == 200

    summary = _run(settings, uuid.UUID(job["id"]), RecordingSink())

    assert (summary["model"]["version"], summary["model"]["sha256"]) == (1, pinned["sha256"])
    assert (summary["images"], summary["labelled"], summary["top_k"]) == (24, True, 3)
    folder = artifacts.job_dir(settings, uuid.UUID(job["id"]))
    rows = list(csv.DictReader((folder / "predictions.csv").open()))
    lines = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == len(lines) == 24
    assert [row["file"] for row in rows] == [f"test/{index}" for index in range(24)]
    ranks = [f"{kind}_{rank}" for rank in (1, 2, 3) for kind in ("pred", "prob")]
    assert list(rows[0]) == ["file", "label", *ranks]
    assert all(abs(sum(line["probabilities"]) - 1) < 1e-4 for line in lines)
    key = client.headers["Authorization"].removeprefix("Bearer ")
    with Client("http://testserver", key, transport=client._transport) as service:
        frame = service.predictions_frame(job["id"])
    assert list(frame["pred_1"]) == [row["pred_1"] for row in rows]
    assert all(isinstance(label, str) for label in frame["label"])
    assert frame["prob_1"].dtype == "float64"

    # The served net's answer for the same images, in file order.
    assert "path" not in pinned  # the server's file stays on the server
    with session_scope(settings.database_url) as session:
        stored = session.get(Job, uuid.UUID(job["id"]))
        assert stored is not None
        path = Path(stored.spec["resolved"]["path"])
    predictor = Predictor(path, sha256=pinned["sha256"])
    split = load_dataset(SyntheticSpec.model_validate(SYNTHETIC), data_root=folder).test
    assert isinstance(split, TensorSplit)
    expected = predictor.probabilities(split.images).argmax(1).tolist()
    classes = predictor.info.classes
    assert [row["pred_1"] for row in rows] == [classes[index] for index in expected]
    assert [line["top_k"]["indices"][0] for line in lines] == expected
    assert [row["label"] for row in rows] == [classes[label] for label in split.labels.tolist()]

    confusion = json.loads((folder / CONFUSION).read_text())
    matrix = torch.tensor(confusion["matrix"])
    assert (confusion["classes"], int(matrix.sum())) == (list(classes), 24)
    assert summary["error"] == pytest.approx(1 - int(matrix.diag().sum()) / 24)
    wrong = sum(row["pred_1"] != row["label"] for row in rows)
    assert summary["error"] == pytest.approx(wrong / 24)


def test_a_predict_job_reads_an_image_folder_by_file_name(
    settings: Settings, client: TestClient, queue: Any, model: uuid.UUID
) -> None:
    tree = settings.data_dir / "pngs"
    for part in ("train", "test"):
        for label in range(10):
            (tree / part / f"class_{label}").mkdir(parents=True, exist_ok=True)
            colour = (label * 25, 255 - label * 25, 0)
            Image.new("RGB", (8, 8), colour).save(tree / part / f"class_{label}" / "x.png")
    dataset = {"name": "imagefolder", "path": "pngs"}
    answer = client.post(JOBS, json=_predict(dataset=dataset, top_k=20))
    assert answer.status_code == 202, answer.text

    summary = _run(settings, uuid.UUID(answer.json()["id"]), RecordingSink())

    folder = artifacts.job_dir(settings, uuid.UUID(answer.json()["id"]))
    rows = list(csv.DictReader((folder / "predictions.csv").open()))
    assert [row["file"] for row in rows] == [f"test/class_{label}/x.png" for label in range(10)]
    assert (summary["images"], summary["top_k"], len(rows[0])) == (10, 10, 2 + 2 * 10)
    assert summary["labelled"]
    assert not (folder / "predictions.jsonl").exists()


def test_a_dataset_of_other_classes_gets_predictions_and_no_errors(
    settings: Settings, client: TestClient, queue: Any, model: uuid.UUID
) -> None:
    others = {**SYNTHETIC, "num_classes": 3, "test_size": 6}
    answer = client.post(JOBS, json=_predict(dataset=others, format="jsonl"))
    job_id = uuid.UUID(answer.json()["id"])

    summary = _run(settings, job_id, RecordingSink())

    assert (summary["images"], summary["labelled"], summary["error"]) == (6, False, None)
    assert [item["name"] for item in summary["artifacts"]] == ["predictions.jsonl"]
    folder = artifacts.job_dir(settings, job_id)
    lines = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert {line["label"] for line in lines} <= {"class_0", "class_1", "class_2"}
    assert all(len(line["probabilities"]) == 10 for line in lines)  # the model's classes


def test_a_cancelled_prediction_leaves_no_partial_files(
    settings: Settings, client: TestClient, queue: Any, model: uuid.UUID
) -> None:
    answer = client.post(JOBS, json=_predict(batch_size=8))
    job_id = uuid.UUID(answer.json()["id"])

    summary = _run(settings, job_id, RecordingSink(stop_at=8))

    assert (summary["stopped"], summary["images"]) == (True, 8)
    assert list(artifacts.job_dir(settings, job_id).iterdir()) == []
    assert client.get(f"{JOBS}/{job_id}/artifacts").json() == []


def test_artifacts_list_and_download_with_their_sha256(
    settings: Settings,
    client: TestClient,
    owner_only: TestClient,
    queue: Any,
    model: uuid.UUID,
    tmp_path: Path,
) -> None:
    job_id = client.post(JOBS, json=_predict(format="jsonl")).json()["id"]
    _run(settings, uuid.UUID(job_id), RecordingSink())

    listed = client.get(f"{JOBS}/{job_id}/artifacts")
    assert listed.status_code == 200, listed.text
    assert [item["name"] for item in listed.json()] == ["predictions.jsonl", CONFUSION]
    for item in listed.json():
        got = client.get(f"{JOBS}/{job_id}/artifacts/{item['name']}")
        assert got.status_code == 200, got.text
        assert hashlib.sha256(got.content).hexdigest() == item["sha256"]
        assert got.headers["X-Checksum-Sha256"] == item["sha256"]
        assert len(got.content) == item["bytes"]
    confusion = client.get(f"{JOBS}/{job_id}/artifacts/{CONFUSION}")
    assert sum(map(sum, confusion.json()["matrix"])) == 24

    missing = client.get(f"{JOBS}/{job_id}/artifacts/predictions.csv")
    assert missing.status_code == 404
    assert "it has: predictions.jsonl, confusion.json" in missing.json()["error"]["message"]
    assert client.get(f"{JOBS}/{uuid.uuid4()}/artifacts").status_code == 404
    assert owner_only.get(f"{JOBS}/{job_id}/artifacts").status_code == 404
    assert owner_only.get(f"{JOBS}/{job_id}/artifacts/{CONFUSION}").status_code == 404

    key = client.headers["Authorization"].removeprefix("Bearer ")
    with Client("http://testserver", key, transport=client._transport) as service:
        assert service.artifacts(job_id) == listed.json()
        saved = service.download_artifact(job_id, "predictions.jsonl", to=tmp_path)
        assert checkpoints.sha256_of(saved) == listed.json()[0]["sha256"]
        frame = service.predictions_frame(job_id)
    assert len(frame) == 24
    assert list(frame.columns) == ["file", "label", "top_k", "probabilities"]

    (artifacts.job_dir(settings, uuid.UUID(job_id)) / CONFUSION).write_text("{}")
    damaged = client.get(f"{JOBS}/{job_id}/artifacts/{CONFUSION}")
    assert damaged.status_code == 409, damaged.text


def test_the_command_line_submits_waits_and_downloads(
    settings: Settings,
    client: TestClient,
    live_url: str,
    queue: Any,
    model: uuid.UUID,
    tmp_path: Path,
) -> None:
    key = client.headers["Authorization"].removeprefix("Bearer ")
    worker = threading.Thread(target=_run_next_queued, args=(settings,))
    worker.start()
    args = ["predict-batch", "tiny/2", "--dataset", "synthetic", "-d", "image_size=8"]
    args += ["-d", "train_size=32", "-d", "test_size=24", "--top-k", "2", "--format", "both"]
    result = CliRunner().invoke(
        app, [*args, "--out", str(tmp_path), "--url", live_url, "--key", key]
    )
    worker.join()

    assert result.exit_code == 0, result.output
    assert "24 images; error" in result.stdout
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == [CONFUSION, "predictions.csv", "predictions.jsonl"]
    assert len((tmp_path / "predictions.csv").read_text().splitlines()) == 1 + 24


def _run_next_queued(settings: Settings) -> None:
    """Run the next predict job submitted (within 30 s), as a worker would."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with session_scope(settings.database_url) as session:
            query = select(Job.id).where(Job.kind == "predict", Job.status == "queued")
            job_id = session.scalars(query).first()
        if job_id is not None:
            _run(settings, job_id, RecordingSink())
            return
        time.sleep(0.05)


def test_with_an_object_store_the_api_serves_the_files_from_the_bucket(
    settings: Settings,
    client: TestClient,
    s3_url: str,
    queue: Any,
    model: uuid.UUID,
    tmp_path: Path,
) -> None:
    # The worker's checkpoints stay where the trained job wrote them; its results go up.
    worker = on_bucket(settings, s3_url, "predictions", tmp_path / "worker")
    worker = worker.model_copy(update={"artifact_dir": settings.artifact_dir})
    job_id = uuid.UUID(client.post(JOBS, json=_predict()).json()["id"])
    _run(worker, job_id, RecordingSink())
    artifacts.delete_job(worker, job_id)  # as a worker does once the job ended

    key = client.headers["Authorization"].removeprefix("Bearer ")
    api = create_app(on_bucket(settings, s3_url, "predictions", tmp_path / "api"))
    with TestClient(api, headers={"Authorization": f"Bearer {key}"}) as remote:
        (csv_file, _) = remote.get(f"{JOBS}/{job_id}/artifacts").json()
        got = remote.get(f"{JOBS}/{job_id}/artifacts/predictions.csv")
    assert got.status_code == 200, got.text
    assert hashlib.sha256(got.content).hexdigest() == csv_file["sha256"]
    assert len(got.content.splitlines()) == 1 + 24
