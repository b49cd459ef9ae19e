"""Explanations over HTTP with a ResNet-8 trained on digits: Grad-CAM heatmaps as arrays
equal to Captum's own on the same net, PNG overlays, the class chosen, and refusals."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from captum.attr import LayerAttribution, LayerGradCam
from fastapi.testclient import TestClient
from PIL import Image

from api.app import create_app
from core import artifacts
from core.settings import Settings
from tests import images
from tests.helpers import make_key, trained_job
from training import checkpoints
from training.data import TensorSplit
from training.datasets import load_dataset
from training.pipeline import Normalise
from training.runs import load_trained_model
from training.specs import DigitsSpec

EXPLAIN = "/api/v1/explain"
DIGITS = DigitsSpec(name="digits", validation=0)
# Most of an epoch; every step's checkpoint kept (`trained_job` reads step 1's).
RUN = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "digits", "validation": 0},
    "recipe": {"iterations": 16, "batch_size": 64, "checkpoint_every": 1, "keep_last": 16},
}


@pytest.fixture(scope="module")
def digits_job(settings: Settings, client: TestClient) -> uuid.UUID:
    """ResNet-8 trained on digits for 30 steps, registered as `digits` by `client`'s key."""
    job_id = trained_job(settings, RUN)
    answer = client.post("/api/v1/registry/digits/versions", json={"job": str(job_id)})
    assert answer.status_code == 201, answer.text
    return job_id


@pytest.fixture(scope="module")
def explainer(anonymous: TestClient, settings: Settings) -> Iterator[TestClient]:
    """A client of the module's app with a predict key."""
    key = make_key(settings.database_url, "predict", "read")
    with TestClient(anonymous.app, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


@pytest.fixture(scope="module")
def test_split(tmp_path_factory: pytest.TempPathFactory) -> TensorSplit:
    """The digits test split, as the training run saw it."""
    test = load_dataset(DIGITS, data_root=tmp_path_factory.mktemp("digits")).test
    assert isinstance(test, TensorSplit)
    return test


def digit_png(test: TensorSplit, index: int) -> bytes:
    """Test image `index` as an 8x8 grayscale PNG."""
    return images.encode(Image.fromarray(test.images[index][0].numpy(), mode="L"))


def as_files(*pngs: tuple[str, bytes]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("files", (name, data, "image/png")) for name, data in pngs]


def captum_heatmaps(
    path: Path, test: TensorSplit, indices: list[int]
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The checkpoint's net's probabilities, and Captum's Grad-CAM of each image's top class
    on its last stage (each map over its maximum) and upsampled to the input."""
    trained = load_trained_model(path)
    net = trained.model.eval()
    normalise = Normalise(trained.preprocessing, torch.device("cpu"), channels_last=False)
    x = normalise(test.images[indices])
    with torch.no_grad():
        probabilities = net(x).softmax(1)
    target = probabilities.argmax(1)
    cam = LayerGradCam(net, net.layer3).attribute(x, target=target, relu_attributions=True)
    cam = cam.detach() / cam.detach().amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-30)
    up = LayerAttribution.interpolate(cam, (8, 8), "bilinear")
    return probabilities, cam[:, 0].numpy(), up[:, 0].numpy()


def test_heatmaps_are_captums_on_the_last_stage(
    explainer: TestClient, digits_job: uuid.UUID, settings: Settings, test_split: TensorSplit
) -> None:
    indices = [0, 1, 2, 3]
    files = as_files(*[(f"d{i}.png", digit_png(test_split, i)) for i in indices])
    answer = explainer.post(EXPLAIN, params={"model": "digits"}, files=files)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["layer"] == "layer3"
    assert body["model"]["job_id"] == str(digits_job)
    assert body["timing"]["total_ms"] >= body["timing"]["explain_ms"] > 0
    results = body["results"]
    assert [r["file"] for r in results] == [f"d{i}.png" for i in indices]
    heatmaps = np.array([r["heatmap"] for r in results])
    upsampled = np.array([r["upsampled"] for r in results])
    # ResNet-8 on 8x8: its last stage's maps are 2x2; upsampled to the 8x8 input.
    assert heatmaps.shape == (4, 2, 2)
    assert upsampled.shape == (4, 8, 8)
    assert heatmaps.min() >= 0
    assert upsampled.min() >= 0
    assert upsampled.max() <= 1
    assert np.allclose(heatmaps.max(axis=(1, 2)), 1)
    # The top class and the maps that Captum's LayerGradCam computes here on the
    # checkpoint's own net.
    best = artifacts.job_dir(settings, digits_job) / checkpoints.DIRECTORY / checkpoints.BEST
    probabilities, maps, upsampled_maps = captum_heatmaps(best, test_split, indices)
    for row, result in zip(probabilities, results, strict=True):
        assert result["explained"]["index"] == int(row.argmax())
        assert result["explained"]["label"] == str(int(row.argmax()))  # digits' classes
        assert result["explained"]["probability"] == pytest.approx(float(row.max()), abs=1e-5)
    assert np.abs(heatmaps - maps).max() < 1e-3
    assert np.abs(upsampled - upsampled_maps).max() < 1e-3


def test_a_named_class_is_explained_and_differs_from_the_top_one(
    explainer: TestClient, digits_job: uuid.UUID, test_split: TensorSplit
) -> None:
    files = as_files(*[(f"d{i}.png", digit_png(test_split, i)) for i in range(4)])
    top = explainer.post(EXPLAIN, params={"model": "digits"}, files=files).json()["results"]
    other = {str((r["explained"]["index"] + 5) % 10) for r in top}
    label = sorted(other)[0]
    named = explainer.post(EXPLAIN, params={"model": "digits", "class": label}, files=files)
    assert named.status_code == 200, named.text
    results = named.json()["results"]
    assert {r["explained"]["label"] for r in results} == {label}
    assert all(r["explained"]["index"] == int(label) for r in results)
    differ = [
        np.abs(np.array(a["upsampled"]) - np.array(b["upsampled"])).max() > 0.05
        for a, b in zip(top, results, strict=True)
        if a["explained"]["index"] != int(label)
    ]
    assert any(differ), "another class's heatmap differs from the top class's"


def test_a_png_overlay_decodes_at_the_input_size(
    explainer: TestClient, digits_job: uuid.UUID, test_split: TensorSplit
) -> None:
    files = as_files(("seven.png", digit_png(test_split, 7)))
    answer = explainer.post(EXPLAIN, params={"model": "digits", "format": "png"}, files=files)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "image/png"
    overlay = Image.open(io.BytesIO(answer.content))
    assert (overlay.format, overlay.size, overlay.mode) == ("PNG", (8, 8), "RGB")
    assert answer.headers["x-explained-layer"] == "layer3"
    assert 0 < float(answer.headers["x-explained-probability"]) <= 1
    # Colour-mapped: the grey digit comes back coloured.
    pixels = np.asarray(overlay, dtype=np.int16)
    assert np.abs(pixels[..., 0] - pixels[..., 2]).max() > 20
    # A raw body gets the same.
    raw = explainer.post(
        EXPLAIN,
        params={"model": "digits", "format": "png"},
        content=digit_png(test_split, 7),
        headers={"Content-Type": "image/png"},
    )
    assert raw.status_code == 200
    assert raw.content == answer.content


@pytest.mark.parametrize(
    ("params", "count", "status", "words"),
    [
        ({"class": "cat"}, 1, 422, "class 'cat' is not one of this model's"),
        ({"class": "10"}, 1, 422, "an index 0 to 9, or one of '0', '1'"),
        ({"format": "gif"}, 1, 422, "format: 'gif' is not one of json, png"),
        ({"format": "png"}, 2, 422, "format=png answers one image"),
        ({}, 5, 413, "5 files is over the limit of 4 per explanation"),
    ],
)
def test_bad_requests_are_refused_saying_why(
    explainer: TestClient,
    digits_job: uuid.UUID,
    test_split: TensorSplit,
    params: dict[str, str],
    count: int,
    status: int,
    words: str,
) -> None:
    files = as_files(*[(f"d{i}.png", digit_png(test_split, i)) for i in range(count)])
    answer = explainer.post(EXPLAIN, params={"model": "digits", **params}, files=files)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["error"]["message"]


def test_a_bad_file_is_refused_as_a_prediction_would(
    explainer: TestClient, digits_job: uuid.UUID
) -> None:
    files = as_files(("notes.txt", b"hello, I am text"))
    answer = explainer.post(EXPLAIN, params={"model": "digits"}, files=files)
    assert answer.status_code == 415, answer.text
    assert "notes.txt: not an image" in answer.json()["error"]["message"]


def test_an_unknown_or_unreadable_model_is_not_found(
    explainer: TestClient, digits_job: uuid.UUID, settings: Settings, test_split: TensorSplit
) -> None:
    files = as_files(("d.png", digit_png(test_split, 0)))
    unknown = explainer.post(EXPLAIN, params={"model": "nothing"}, files=files)
    assert unknown.status_code == 404, unknown.text
    assert "model 'nothing' is not registered" in unknown.json()["error"]["message"]
    # Reads kept to their owner: another key's model is not found either.
    key = make_key(settings.database_url, "predict", "read")
    strict = create_app(settings.model_copy(update={"reads_owner_only": True}))
    with TestClient(strict, headers={"Authorization": f"Bearer {key}"}) as other:
        hidden = other.post(EXPLAIN, params={"model": "digits"}, files=files)
    assert hidden.status_code == 404, hidden.text
    assert "model 'digits' is not registered" in hidden.json()["error"]["message"]


def test_explaining_needs_the_predict_scope(
    client: TestClient, digits_job: uuid.UUID, test_split: TensorSplit
) -> None:
    files = as_files(("d.png", digit_png(test_split, 0)))
    answer = client.post(EXPLAIN, params={"model": "digits"}, files=files)  # read + train
    assert answer.status_code == 403, answer.text
