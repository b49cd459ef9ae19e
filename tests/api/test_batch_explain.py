"""Predict jobs that explain: Grad-CAM overlays and arrays written beside the predictions,
listed in the job's artifacts, equal to the explanation of the same images on the net."""

from __future__ import annotations

import io
import uuid
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from core import artifacts
from core.settings import Settings
from tests.helpers import run_job, trained_job
from training import gradcam
from training.batch_predict import HEATMAPS, overlay_name
from training.data import TensorSplit
from training.datasets import load_dataset
from training.events import RecordingSink
from training.pipeline import Normalise
from training.runs import load_trained_model
from training.specs import SyntheticSpec

JOBS = "/api/v1/jobs"
SYNTHETIC = {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 12}


@pytest.fixture(scope="module")
def model(settings: Settings, client: TestClient) -> uuid.UUID:
    """A trained job registered as `tiny`."""
    job_id = trained_job(settings)
    added = client.post("/api/v1/registry/tiny/versions", json={"job": str(job_id)})
    assert added.status_code == 201, added.text
    return job_id


def _submit(client: TestClient, explain: Any) -> uuid.UUID:
    sent = {"kind": "predict", "model": "tiny", "dataset": SYNTHETIC, "explain": explain}
    answer = client.post(JOBS, json=sent)
    assert answer.status_code == 202, answer.text
    return uuid.UUID(answer.json()["id"])


def test_a_predict_job_writes_heatmaps_beside_its_predictions(
    settings: Settings, client: TestClient, model: uuid.UUID
) -> None:
    job_id = _submit(client, {"images": 5, "target": "label"})
    summary = run_job(settings, job_id, RecordingSink())
    names = [entry["name"] for entry in summary["artifacts"]]
    overlays = [overlay_name(index) for index in range(5)]
    assert names == ["predictions.csv", "confusion.json", *overlays, HEATMAPS]
    listed = client.get(f"{JOBS}/{job_id}/artifacts").json()
    assert {entry["name"] for entry in listed} >= {*overlays, HEATMAPS}
    png = client.get(f"{JOBS}/{job_id}/artifacts/{overlays[0]}")
    assert png.status_code == 200, png.text
    assert Image.open(io.BytesIO(png.content)).size == (8, 8)

    folder = artifacts.job_dir(settings, job_id)
    arrays = np.load(folder / HEATMAPS)
    assert list(arrays["files"]) == [f"test/{index}" for index in range(5)]
    assert arrays["heatmaps"].shape == (5, 2, 2)
    assert arrays["upsampled"].shape == (5, 8, 8)
    assert str(arrays["layer"]) == "layer3"
    # The labels explained, and the same maps as the net's Grad-CAM of those images.
    split = load_dataset(SyntheticSpec.model_validate(SYNTHETIC), data_root=settings.data_dir).test
    assert isinstance(split, TensorSplit)
    assert arrays["classes"].tolist() == split.labels[:5].tolist()
    best = artifacts.job_dir(settings, model) / "checkpoints" / "best.pt"
    trained = load_trained_model(best)
    x = Normalise(trained.preprocessing, torch.device("cpu"), channels_last=False)(split.images[:5])
    net = gradcam.explainable(trained.model)
    expected = gradcam.grad_cam(net, x, split.labels[:5].tolist())
    assert np.abs(arrays["upsampled"] - expected.upsampled).max() < 1e-5


def test_true_explains_the_first_images_for_their_top_class(
    settings: Settings, client: TestClient, model: uuid.UUID
) -> None:
    job_id = _submit(client, True)
    summary = run_job(settings, job_id, RecordingSink())
    names = [entry["name"] for entry in summary["artifacts"]]
    assert names.count(HEATMAPS) == 1
    assert sum(name.startswith("heatmap-") for name in names) == 12  # all 12, under 16
    refused = client.post(
        JOBS,
        json={"kind": "predict", "model": "tiny", "dataset": SYNTHETIC, "explain": {"images": 0}},
    )
    assert refused.status_code == 422, refused.text
    assert "images" in refused.json()["error"]["message"]
