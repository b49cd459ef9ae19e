"""Imported weights over HTTP: each format becomes a version that predicts as its source."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image
from safetensors.torch import save_file
from torchvision.transforms import v2

import models
from api.app import create_app
from core.settings import Settings
from tests import images
from tests.helpers import make_key, run_job
from tests.training.test_weights import Payload, akamaster_file, seeded_torchvision
from training import weights
from training.events import RecordingSink

PREDICT = "/api/v1/predict"


def imported(
    client: TestClient, name: str, path: Path, **fields: Any
) -> tuple[int, dict[str, Any]]:
    """POST the file to the import of `name`; the status and the body."""
    form = {key: v if isinstance(v, str) else json.dumps(v) for key, v in fields.items()}
    with path.open("rb") as f:
        answer = client.post(
            f"/api/v1/registry/{name}/versions/import", data=form, files={"file": (path.name, f)}
        )
    return answer.status_code, answer.json()


@pytest.fixture(scope="module")
def predictor(anonymous: TestClient, settings: Settings) -> Iterator[TestClient]:
    """A client of the module's app with a predict key."""
    key = make_key(settings.database_url, "predict", "read")
    with TestClient(anonymous.app, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


@pytest.fixture(scope="module")
def resnet18_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchvision's ResNet-18, seeded, saved as `torch.save(state_dict)`."""
    path = tmp_path_factory.mktemp("weights") / "resnet18-seeded.pth"
    torch.save(seeded_torchvision().state_dict(), path)
    return path


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A non-square RGB image of smooth noise."""
    generator = torch.Generator().manual_seed(seed)
    small = torch.randint(0, 256, (height // 8, width // 8, 3), generator=generator)
    image = Image.fromarray(small.to(torch.uint8).numpy(), mode="RGB")
    return image.resize((width, height), Image.Resampling.BICUBIC)


def probabilities(predictor: TestClient, ref: str, image: Image.Image) -> dict[int, float]:
    """The top-5 probabilities /predict answers for one image, by class index."""
    files = [("files", ("photo.png", images.encode(image), "image/png"))]
    answer = predictor.post(PREDICT, params={"model": ref, "top_k": 5}, files=files)
    assert answer.status_code == 200, answer.text
    return {score["index"]: score["probability"] for score in answer.json()["results"][0]["top_k"]}


def reference(net: torch.nn.Module, image: Image.Image, transform: v2.Transform) -> torch.Tensor:
    """A net's class probabilities for the image after torchvision's own transforms."""
    with torch.no_grad():
        return torch.softmax(net.eval()(transform(image)[None]), dim=1)[0]


def normalised(mean: tuple[float, ...], std: tuple[float, ...]) -> list[v2.Transform]:
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]


def test_a_torchvision_file_predicts_as_torchvisions_net(
    client: TestClient, predictor: TestClient, resnet18_file: Path
) -> None:
    status, version = imported(client, "tv-resnet18", resnet18_file, architecture="resnet18")
    assert status == 201, version
    facts = version["imported"]
    assert (facts["format"], facts["checked_against"], facts["keys"]) == (
        "torchvision",
        "torchvision",
        len(seeded_torchvision().state_dict()),
    )
    assert facts["max_abs_diff"] <= weights.TOLERANCE
    assert facts["source_sha256"] == hashlib.sha256(resnet18_file.read_bytes()).hexdigest()
    assert (version["version"], version["model"], version["checkpoint"]) == (1, "resnet18", "best")
    image = photo(300, 260)
    transform = v2.Compose(
        [
            v2.Resize(256),
            v2.CenterCrop(224),
            *normalised(weights.IMAGENET_MEAN, weights.IMAGENET_STD),
        ]
    )
    expected = reference(seeded_torchvision(), image, transform)
    served = probabilities(predictor, "tv-resnet18/1", image)
    for index, probability in served.items():
        assert probability == pytest.approx(float(expected[index]), abs=1e-4)
    assert set(served) == set(expected.topk(5).indices.tolist())


def test_an_import_is_a_succeeded_job_that_lists_and_refuses_retry(
    client: TestClient, resnet18_file: Path
) -> None:
    status, version = imported(client, "tv-again", resnet18_file, architecture="resnet18")
    assert status == 201, version
    job = client.get(f"/api/v1/jobs/{version['job_id']}").json()
    assert (job["kind"], job["status"], job["model"]) == ("import", "succeeded", "resnet18")
    assert job["dataset"] == "imported:resnet18-seeded.pth"
    assert job["summary"]["source_sha256"] == version["imported"]["source_sha256"]
    listed = client.get("/api/v1/jobs", params={"kind": "import"}).json()["items"]
    assert version["job_id"] in {item["id"] for item in listed}
    retried = client.post(f"/api/v1/jobs/{version['job_id']}/retry")
    assert retried.status_code == 409
    (row,) = client.get(f"/api/v1/jobs/{version['job_id']}/checkpoints").json()
    assert row["sha256"] == version["sha256"]
    submitted = client.post(
        "/api/v1/jobs",
        json={
            "kind": "import",
            "model": {"name": "resnet18"},
            "format": "torchvision",
            "file_name": "x.pth",
            "classes": 10,
        },
    )
    assert submitted.status_code == 422
    assert "not submitted" in submitted.json()["error"]["message"]


def test_an_akamaster_file_predicts_as_the_net_it_came_from(
    client: TestClient, predictor: TestClient, tmp_path: Path
) -> None:
    torch.manual_seed(2)
    source = models.build("resnet20", num_classes=10).eval()
    path = akamaster_file(tmp_path / "resnet20-12fca82f.th", source)
    status, version = imported(client, "cifar-resnet20", path, architecture="resnet20")
    assert status == 201, version
    assert version["imported"]["format"] == "akamaster"
    assert version["imported"]["checked_against"] is None
    image = photo(32, 32, seed=3)
    expected = reference(
        source, image, v2.Compose(normalised(weights.IMAGENET_MEAN, weights.IMAGENET_STD))
    )
    for index, probability in probabilities(predictor, "cifar-resnet20", image).items():
        assert probability == pytest.approx(float(expected[index]), abs=1e-4)


def test_a_safetensors_file_with_its_classes_and_preprocessing(
    client: TestClient, predictor: TestClient, tmp_path: Path
) -> None:
    torch.manual_seed(4)
    source = models.build("resnet20", num_classes=3).eval()
    path = tmp_path / "three.safetensors"
    save_file(source.state_dict(), path)
    declared = {"resize": 40, "crop": 32, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}
    status, version = imported(
        client,
        "three",
        path,
        architecture="resnet20",
        classes=["a", "b", "c"],
        preprocessing=declared,
    )
    assert status == 201, version
    image = photo(64, 48, seed=5)
    transform = v2.Compose([v2.Resize(40), v2.CenterCrop(32), *normalised((0.5,) * 3, (0.25,) * 3)])
    expected = reference(source, image, transform)
    files = [("files", ("photo.png", images.encode(image), "image/png"))]
    answer = predictor.post(PREDICT, params={"model": "three", "top_k": 3}, files=files).json()
    scores = answer["results"][0]["top_k"]
    assert {score["label"] for score in scores} == {"a", "b", "c"}
    for score in scores:
        assert score["probability"] == pytest.approx(float(expected[score["index"]]), abs=1e-4)


def test_mismatched_keys_are_a_422_that_lists_them(client: TestClient, resnet18_file: Path) -> None:
    status, body = imported(client, "wrong-net", resnet18_file, architecture="resnet34")
    assert status == 422, body
    message = body["error"]["message"]
    assert "missing: layer1.2.conv1.weight" in message
    assert body["error"]["details"][0]["loc"] == ["body", "file"]
    status, body = imported(
        client, "wrong-classes", resnet18_file, architecture="resnet18", classes=["cat", "dog"]
    )
    assert status == 422
    assert "fc.weight (1000, 512) vs (2, 512)" in body["error"]["message"]


def test_a_pickle_with_code_is_a_422_and_runs_nothing(
    client: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "evil.pth"
    torch.save({"conv1.weight": torch.zeros(1), "x": Payload()}, path)
    status, body = imported(client, "evil", path, architecture="resnet18")
    assert status == 422
    assert "pickled code" in body["error"]["message"]
    assert "unpickled\n" not in capsys.readouterr().out
    assert client.get("/api/v1/registry/evil").status_code == 404


def test_a_file_over_the_limit_is_a_413(settings: Settings, tmp_path: Path) -> None:
    small = settings.model_copy(update={"import_max_bytes": 4096})
    key = make_key(settings.database_url, "train", "read")
    with TestClient(create_app(small), headers={"Authorization": f"Bearer {key}"}) as client:
        (tmp_path / "big.pth").write_bytes(b"\0" * 8192)  # past the file's limit
        status, body = imported(client, "big", tmp_path / "big.pth", architecture="resnet18")
        assert status == 413, body
        assert "IMPORT_MAX_BYTES" in body["error"]["message"]
        (tmp_path / "huge.pth").write_bytes(b"\0" * (2 * 2**20))  # past the body's limit
        status, body = imported(client, "big", tmp_path / "huge.pth", architecture="resnet18")
        assert status == 413
        assert "larger than the limit" in body["error"]["message"]


def test_another_key_cannot_add_to_a_model_it_does_not_own(
    anonymous: TestClient, settings: Settings, tmp_path: Path
) -> None:
    torch.manual_seed(6)
    path = tmp_path / "r20.safetensors"
    save_file(models.build("resnet20", num_classes=10).state_dict(), path)
    url = settings.database_url
    keys = [{"Authorization": f"Bearer {make_key(url, 'train', 'read')}"} for _ in range(2)]
    with TestClient(anonymous.app, headers=keys[0]) as alice:
        assert imported(alice, "alices", path, architecture="resnet20")[0] == 201
        with TestClient(anonymous.app, headers=keys[1]) as bob:
            status, body = imported(bob, "alices", path, architecture="resnet20")
        assert status == 403
        assert "does not own model 'alices'" in body["error"]["message"]
        versions = alice.get("/api/v1/registry/alices").json()["versions"]
        assert [v["version"] for v in versions] == [1]


def test_named_torchvision_weights_need_downloads(client: TestClient) -> None:
    answer = client.post(
        "/api/v1/registry/tv50/versions/import",
        data={"weights": "ResNet50_Weights.IMAGENET1K_V2"},
    )
    assert answer.status_code == 422
    assert "downloads are off" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"architecture": "resnet21"}, "resnet21"),
        ({"architecture": "resnet18", "classes": "[1, 2"}, "classes is not JSON"),
        ({"architecture": "resnet18", "preprocessing": {"size": 3}}, "size"),
        ({"architecture": "resnet18", "format": "onnx"}, "format"),
    ],
)
def test_bad_fields_are_named(
    client: TestClient, resnet18_file: Path, fields: dict[str, Any], words: str
) -> None:
    status, body = imported(client, "bad-fields", resnet18_file, **fields)
    assert status == 422, body
    assert words in json.dumps(body["error"])


def test_an_imported_version_takes_batch_predictions(client: TestClient, tmp_path: Path) -> None:
    torch.manual_seed(7)
    path = tmp_path / "batch.safetensors"
    save_file(models.build("resnet20", num_classes=10).state_dict(), path)
    status, version = imported(client, "batch-net", path, architecture="resnet20")
    assert status == 201, version
    spec = {"kind": "predict", "model": "batch-net", "dataset": {"name": "synthetic"}}
    answer = client.post("/api/v1/jobs", json=spec)
    assert answer.status_code == 202, answer.text
    job = answer.json()
    assert (job["model"], job["source_job"]) == ("resnet20", version["job_id"])
    assert job["spec"]["resolved"]["sha256"] == version["sha256"]


def test_an_imported_version_is_fine_tuned_by_a_train_job(
    client: TestClient, settings: Settings, tmp_path: Path
) -> None:
    torch.manual_seed(11)
    path = tmp_path / "pre.safetensors"
    pretrained = models.build("resnet8", num_classes=10)
    save_file(pretrained.state_dict(), path)
    status, version = imported(client, "pre", path, architecture="resnet8")
    assert status == 201, version
    spec = {
        "kind": "train",
        "model": {"name": "resnet8"},
        "dataset": {"name": "synthetic", "num_classes": 4, "image_size": 32, "train_size": 64},
        "recipe": {"iterations": 2, "batch_size": 32},
        "init": {"source": "pre", "freeze": ["stem"]},
    }
    answer = client.post("/api/v1/jobs", json=spec)
    assert answer.status_code == 202, answer.text
    job = answer.json()
    assert job["spec"]["init"]["resolved"]["job_id"] == version["job_id"]
    summary = run_job(settings, uuid.UUID(job["id"]), RecordingSink())
    assert summary["steps"] == 2
    trained = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert trained["status"] == "succeeded"
    # The stem came from the imported weights and stayed: the fine-tune's checkpoint has it.
    saved = torch.load(
        next(Path(settings.artifact_dir).glob(f"jobs/{job['id']}/checkpoints/best.pt")),
        weights_only=True,
    )
    assert torch.equal(saved["model"]["conv1.weight"], pretrained.state_dict()["conv1.weight"])
    assert saved["model"]["fc.weight"].shape[0] == 4  # a new head for four classes


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("classes", ["cat\x00", "dog"]),
        ("options", {"unit\x00": "original"}),
        ("format", "au\x01to"),
    ],
)
def test_a_control_character_in_a_form_field_is_a_422_naming_it(
    client: TestClient, resnet18_file: Path, field: str, value: Any
) -> None:
    fields = {"architecture": "resnet18", field: value}
    status, body = imported(client, "nul-net", resnet18_file, **fields)
    assert status == 422, body
    assert f"{field} contains a control character" in body["error"]["message"]
    assert body["error"]["details"][0]["loc"] == ["body", field]
