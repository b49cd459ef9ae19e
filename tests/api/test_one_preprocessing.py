"""One photo, four paths: an evaluate job, a batch prediction, /api/v1/predict and /v2 all
make it input through the checkpoint's declared preprocessing, and agree on it."""

from __future__ import annotations

import base64
import json
import math
import uuid
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from core import artifacts
from core.settings import Settings
from tests import images
from tests.helpers import run_job, trained_job
from training.events import RecordingSink

CLASSES = ("cat", "dog")


def _photo(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    xs = np.mgrid[0:height, 0:width][1]
    tint = np.array([200, 60, 60] if seed % 2 else [60, 60, 200])
    base = tint * (xs[..., None] / width) + rng.normal(0, 20, (height, width, 3))
    return Image.fromarray(base.clip(0, 255).astype(np.uint8), "RGB")


def _tree(root: Path, per_class: int, sizes: list[tuple[int, int]]) -> None:
    for label, name in enumerate(CLASSES):
        for split in ("train", "test"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(per_class):
                width, height = sizes[index % len(sizes)]
                _photo(width, height, 2 * index + label).save(folder / f"{index}.png")


@pytest.fixture(scope="module")
def photo(settings: Settings) -> bytes:
    """The non-square photo that goes down every path, alone in the test split of `one`."""
    _tree(settings.data_dir / "photos", 6, [(40, 24), (24, 36), (30, 30)])
    one = settings.data_dir / "one"
    for name in CLASSES:
        (one / "train" / name).mkdir(parents=True)
        _photo(20, 20, 1).save(one / "train" / name / "x.png")
    (one / "test" / "cat").mkdir(parents=True)
    (one / "test" / "dog").mkdir(parents=True)  # empty: every class is a folder of each split
    picture = _photo(48, 28, 7)  # 12:7, so the centre crop cuts its sides
    picture.save(one / "test" / "cat" / "photo.png")
    return images.encode(picture)


@pytest.fixture(scope="module")
def registered(settings: Settings, client: TestClient, photo: bytes) -> str:
    run = {
        "model": {"name": "resnet8"},
        "dataset": {"name": "imagefolder", "path": "photos", "image_size": 16, "validation": 0},
        "recipe": {"iterations": 2, "batch_size": 8, "checkpoint_every": 1},
    }
    job_id = trained_job(settings, run)
    added = client.post("/api/v1/registry/photos/versions", json={"job": str(job_id)})
    assert added.status_code == 201, added.text
    return str(job_id)


def _submitted(client: TestClient, spec: dict[str, object]) -> uuid.UUID:
    answer = client.post("/api/v1/jobs", json=spec)
    assert answer.status_code == 202, answer.text
    return uuid.UUID(answer.json()["id"])


ONE = {"name": "imagefolder", "path": "one", "image_size": 16, "validation": 0}


def test_the_same_probabilities_down_every_path(
    settings: Settings, admin: TestClient, registered: str, photo: bytes
) -> None:
    # /api/v1/predict
    answer = admin.post(
        "/api/v1/predict",
        params={"model": "photos", "top_k": 2},
        files={"files": ("photo.png", photo, "image/png")},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["preprocessing"]["resize"] == 16
    (result,) = body["results"]
    assert result["resize"] == "resize+center-crop"
    served = {top["label"]: top["probability"] for top in result["top_k"]}
    # /v2, the photo as IMAGE_BYTES
    tensor = {
        "name": "IMAGE_BYTES",
        "datatype": "BYTES",
        "shape": [1],
        "data": [base64.b64encode(photo).decode()],
    }
    v2 = admin.post("/v2/models/photos/infer", json={"inputs": [tensor]})
    assert v2.status_code == 200, v2.text
    (output,) = v2.json()["outputs"]
    protocol = dict(zip(CLASSES, output["data"], strict=True))
    # a batch prediction job
    predict_job = _submitted(
        admin,
        {
            "kind": "predict",
            "model": "photos",
            "format": "jsonl",
            "dataset": {**ONE, "split": "test"},
        },
    )
    predicted = run_job(settings, predict_job, RecordingSink())
    assert predicted["images"] == 1
    rows = (artifacts.job_dir(settings, predict_job) / "predictions.jsonl").read_text()
    (line,) = [json.loads(row) for row in rows.splitlines()]
    batch = dict(zip(CLASSES, line["probabilities"], strict=True))
    # an evaluate job: one image of class cat, so its loss is -log p(cat)
    evaluate_job = _submitted(
        admin, {"kind": "evaluate", "source_job": registered, "dataset": {**ONE, "split": "test"}}
    )
    evaluated = run_job(settings, evaluate_job, RecordingSink())
    assert (evaluated["count"], evaluated["view"]) == (1, "center")
    p_cat = math.exp(-evaluated["loss"])
    for probabilities in (served, protocol, batch):
        assert probabilities["cat"] == pytest.approx(p_cat, abs=1e-4)
        assert probabilities["dog"] == pytest.approx(1 - p_cat, abs=1e-4)
