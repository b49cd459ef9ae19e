"""The Python client imports weights: a file becomes a version; a refusal is an exception."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import models
from client import Client, InvalidError
from core.settings import Settings
from tests.helpers import make_key
from tests.training.test_weights import akamaster_file


@pytest.fixture
def service(live_url: str, settings: Settings) -> Iterator[Client]:
    key = make_key(settings.database_url, "read", "train", "predict")
    with Client(live_url, key, timeout=60) as client:
        yield client


def test_import_weights_adds_a_version_with_what_was_imported(
    service: Client, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    net = models.build("resnet20", num_classes=10)
    name = f"imported-{uuid.uuid4().hex[:8]}"
    first = service.import_weights(
        name, akamaster_file(tmp_path / "resnet20.th", net), architecture="resnet20"
    )
    imported = first.get("imported")
    assert imported is not None
    assert (first["version"], imported["format"], imported["file_name"]) == (
        1,
        "akamaster",
        "resnet20.th",
    )
    save_file(net.state_dict(), tmp_path / "resnet20.safetensors")
    second = service.import_weights(
        name,
        tmp_path / "resnet20.safetensors",
        architecture="resnet20",
        classes=[f"class {n}" for n in range(10)],
        preprocessing={"crop": 32, "resize": 36},
    )
    assert second["version"] == 2
    assert [v["version"] for v in service.registered(name)["versions"]] == [1, 2]
    png = tmp_path / "gray.png"
    Image.new("RGB", (40, 30), (120, 130, 140)).save(png)
    answer = service.predict(png, f"{name}/2", top_k=1)
    assert answer["results"][0]["top_k"][0]["label"].startswith("class ")
    with pytest.raises(InvalidError, match="missing"):
        service.import_weights(name, tmp_path / "resnet20.safetensors", architecture="resnet32")
    with pytest.raises(InvalidError, match="downloads are off"):
        service.import_weights(name, weights="ResNet18_Weights.IMAGENET1K_V1")
