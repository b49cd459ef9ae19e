"""The augmentation recipes: cifar, imagenet_scale and random_resized_crop, in memory and
from files, seeded and resumable like every other draw of the pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from training.data import DatasetInfo, FileSplit, TensorSplit
from training.pipeline import Augmentation, _draw_boxes, make_batches
from training.preprocess import Preprocessing
from training.specs import AugmentationRecipe

INFO = DatasetInfo("t", ("a", "b"), 3, (32, 32), (0.5,) * 3, (0.25,) * 3)


def split(count: int = 40) -> TensorSplit:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (count, 3, 32, 32), dtype=torch.uint8, generator=generator)
    return TensorSplit(images, torch.arange(count) % 2)


def batches_of(
    data: TensorSplit | FileSplit,
    augment: Augmentation | bool,
    *,
    start: int = 0,
    batch_size: int = 16,
    preprocessing: Preprocessing | None = None,
) -> list[torch.Tensor]:
    """Epoch 1's batches (from batch `start`), shuffled with seed 3 unless not augmenting."""
    made = make_batches(
        data,
        INFO,
        batch_size=batch_size,
        device=torch.device("cpu"),
        augment=augment,
        shuffle=augment is not False,
        drop_last=False,
        seed=3,
        num_workers=0,
        preprocessing=preprocessing,
    )
    return [x for x, _ in made.epoch(1, start=start)]


@pytest.mark.parametrize("recipe", ["imagenet_scale", "random_resized_crop"])
def test_resizing_recipes_in_memory_are_seeded_resumable_and_vary(
    recipe: AugmentationRecipe,
) -> None:
    augment = Augmentation(recipe=recipe, lighting=0.1 if recipe == "imagenet_scale" else 0.0)
    data = split()
    first, again = batches_of(data, augment), batches_of(data, augment)
    assert [x.shape for x in first] == [(16, 3, 32, 32), (16, 3, 32, 32), (8, 3, 32, 32)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    resumed = batches_of(data, augment, start=1)
    assert torch.equal(resumed[0], first[1])
    plain = batches_of(data, Augmentation(pad=0, flip=False))
    assert not torch.equal(first[0], plain[0])  # the crops are not the images


def test_boxes_stay_inside_the_image_and_follow_the_recipes_ranges() -> None:
    scale = _draw_boxes(1, 0, 0, 4096, Augmentation(recipe="imagenet_scale"), (32, 32))
    x1, y1, x2, y2 = scale[:4]
    assert float(x1.min()) >= 0
    assert float(x2.max()) <= 32
    assert float(y2.max()) <= 32
    sides = x2 - x1
    assert torch.allclose(sides, y2 - y1)  # square boxes: the aspect is kept
    # The shorter side in [256, 480] at 224: boxes of 224/480 to 224/256 of the side.
    assert float(sides.min()) >= 32 * 224 / 480 - 1e-6
    assert float(sides.max()) <= 32 * 224 / 256 + 1e-6
    rrc = _draw_boxes(1, 0, 0, 4096, Augmentation(recipe="random_resized_crop"), (32, 32))
    area = (rrc[2] - rrc[0]) * (rrc[3] - rrc[1]) / 32**2
    assert float(area.min()) >= 0.08 - 1e-6
    assert float(area.max()) <= 1 + 1e-6
    assert float(area.median()) < 0.7  # mostly partial crops, as torchvision draws them
    assert 0.4 < float(rrc[4].mean()) < 0.6  # half flipped


def test_lighting_shifts_colour_only_in_the_scale_recipe() -> None:
    with pytest.raises(ValueError, match="imagenet_scale recipe only"):
        Augmentation(recipe="random_resized_crop", lighting=0.1)
    boxes = _draw_boxes(1, 0, 0, 64, Augmentation(recipe="imagenet_scale", lighting=0.1), (32, 32))
    assert 0.05 < float(boxes[5:].std()) < 0.2


def photos(folder: Path, count: int) -> FileSplit:
    rng = np.random.default_rng(0)
    paths = []
    for index in range(count):
        size = (int(rng.integers(40, 90)), int(rng.integers(40, 90)))
        path = folder / f"{index}.png"
        Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return FileSplit(tuple(paths), torch.arange(count) % 2)


@pytest.mark.parametrize("recipe", ["cifar", "imagenet_scale", "random_resized_crop"])
def test_every_recipe_makes_input_sized_images_from_photos_of_any_size(
    tmp_path: Path, recipe: AugmentationRecipe
) -> None:
    files = photos(tmp_path, 20)
    augment = Augmentation(
        pad=4, recipe=recipe, lighting=0.1 if recipe == "imagenet_scale" else 0.0
    )
    preprocessing = Preprocessing.of(INFO)
    first = batches_of(files, augment, preprocessing=preprocessing)
    again = batches_of(files, augment, preprocessing=preprocessing)
    assert [x.shape for x in first] == [(16, 3, 32, 32), (4, 3, 32, 32)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_evaluation_from_files_applies_the_declared_preprocessing(tmp_path: Path) -> None:
    files = photos(tmp_path, 5)
    preprocessing = Preprocessing.of(INFO)
    (x,) = batches_of(files, False, batch_size=5, preprocessing=preprocessing)
    expected = torch.stack(
        [torch.from_numpy(preprocessing.image(Image.open(p))) for p in files.paths]
    )
    normalised = (expected.float() / 255 - 0.5) / 0.25
    assert torch.allclose(x, normalised, atol=1e-5)
