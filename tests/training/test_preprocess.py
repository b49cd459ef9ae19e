"""The declared preprocessing: its record, torchvision's transforms, every mode of image."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models import ResNet18_Weights

from training.data import DatasetInfo
from training.pipeline import Normalise
from training.preprocess import Preprocessing, preprocessing_of

IMAGENET = Preprocessing(
    crop=(224, 224),
    resize=256,
    interpolation="bilinear",
    channels=3,
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225),
)


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth non-square 'photo': gradients and noise, so a crop's place matters."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width]
    base = np.stack([xs * 255 / width, ys * 255 / height, (xs + ys) % 256], axis=-1)
    noisy = base + rng.normal(0, 12, base.shape)
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8), "RGB")


def test_the_record_round_trips() -> None:
    assert Preprocessing.from_record(IMAGENET.to_record()) == IMAGENET


def test_it_equals_torchvisions_imagenet_transforms_on_a_non_square_photo() -> None:
    image = photo(400, 300)
    ours = Normalise(IMAGENET, torch.device("cpu"), channels_last=False)(
        torch.from_numpy(IMAGENET.image(image))[None]
    )
    theirs = ResNet18_Weights.IMAGENET1K_V1.transforms()(image)[None]
    assert ours.shape == theirs.shape == (1, 3, 224, 224)
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_without_a_resize_the_image_is_stretched_to_the_input() -> None:
    stretch = Preprocessing((8, 8), None, "bilinear", 3, (0.5,) * 3, (0.25,) * 3)
    wide = Image.new("RGB", (32, 8), (0, 0, 0))
    wide.paste((255, 255, 255), (0, 0, 8, 8))  # white on the left quarter
    array = stretch.image(wide)
    assert array.shape == (3, 8, 8)
    assert array[:, :, 0].min() > 200  # still there: nothing was cropped
    assert stretch.describe(wide) == "resize"
    assert IMAGENET.describe(photo(400, 300)) == "resize+center-crop"


def test_exif_orientation_is_applied_before_anything_else() -> None:
    upright = photo(60, 40)
    rotated = upright.rotate(90, expand=True)  # stored on its side (turned anticlockwise)...
    exif = Image.Exif()
    exif[0x0112] = 6  # ...with the tag that says "turn 90 degrees clockwise to view"
    path_bytes = io.BytesIO()
    rotated.save(path_bytes, "PNG", exif=exif)
    reopened = Image.open(path_bytes)
    small = Preprocessing((20, 30), None, "nearest", 3, (0.5,) * 3, (0.25,) * 3)
    assert np.array_equal(small.image(reopened), small.image(upright))


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "CMYK", "I;16", "1"])
def test_every_mode_becomes_the_declared_channels(mode: str) -> None:
    image = photo(50, 30).convert(mode) if mode != "I;16" else Image.new("I;16", (50, 30), 40_000)
    for channels in (1, 3):
        declared = Preprocessing(
            (16, 16), 16, "bilinear", channels, (0.5,) * channels, (1.0,) * channels
        )
        array = declared.image(image)
        assert array.shape == (channels, 16, 16)
        assert array.dtype == np.uint8
    if mode == "I;16":  # scaled to 8 bits, not clipped at 255
        assert int(declared.image(image).min()) == 40_000 >> 8


def test_a_checkpoint_without_a_record_gets_what_serving_did_before() -> None:
    info = DatasetInfo("c", ("a", "b"), 3, (32, 32), (0.5,) * 3, (0.25,) * 3)
    old = preprocessing_of({"data": info.to_record()})
    assert (old.crop, old.resize, old.mean) == ((32, 32), 32, info.mean)
    assert (
        preprocessing_of({"data": info.to_record(), "preprocessing": IMAGENET.to_record()})
        == IMAGENET
    )


def test_bad_declarations_are_refused() -> None:
    with pytest.raises(ValueError, match="interpolation 'lanczos' is unknown"):
        Preprocessing((8, 8), 8, "lanczos", 3, (0.5,) * 3, (0.25,) * 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one value per channel"):
        Preprocessing((8, 8), 8, "bilinear", 3, (0.5,), (0.25,))
