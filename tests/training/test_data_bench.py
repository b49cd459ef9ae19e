"""The data pipeline benchmark's file section, on the CPU at tiny counts."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from bench import data_pipeline
from training.data import FileSplit
from training.pipeline import Augmentation


def test_photos_stream_through_the_file_pipeline_at_224(tmp_path: Path) -> None:
    data_pipeline.write_photos(tmp_path / "photos", 6)
    files = sorted((tmp_path / "photos").rglob("*.jpg"))
    assert len(files) == 6
    with Image.open(files[0]) as image:
        assert (image.format, image.height, image.width) == ("JPEG", 300, 400)
    data = data_pipeline.file_data(tmp_path, "photos", 224)
    assert isinstance(data.train, FileSplit)
    assert data.info.image_size == (224, 224)
    augmentation = Augmentation(recipe="random_resized_crop")
    counted, rate = data_pipeline.file_pipeline(data, augmentation, 2, 0, torch.device("cpu"))
    assert counted == len(data.train) - 2  # batches of two, the first untimed
    assert rate > 0


def test_cifar_files_and_the_training_step_are_measured(tmp_path: Path) -> None:
    data_pipeline.write_cifar_files(tmp_path / "cifar", 20)
    data = data_pipeline.file_data(tmp_path, "cifar", None)
    assert (data.info.image_size, data.info.num_classes, len(data.train)) == ((32, 32), 10, 20)
    counted, _ = data_pipeline.file_pipeline(data, Augmentation(pad=4), 8, 0, torch.device("cpu"))
    assert counted == len(data.train) - 8
    assert data_pipeline.training_step("resnet20", (3, 32, 32), 4, 1, torch.device("cpu")) > 0
