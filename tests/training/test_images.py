"""Decoding real image files of every Pillow mode a user's photos arrive in, one way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import torch
from PIL import Image
from pydantic import TypeAdapter

from training.data import FileSplit, TensorSplit
from training.datasets import load_dataset
from training.datasets.images import decode, normalised, read_image, upright_size
from training.pipeline import make_batches
from training.preprocess import Preprocessing
from training.specs import DatasetSpec

U8 = npt.NDArray[np.uint8]
HEIGHT, WIDTH = 16, 24  # every file below is this size once upright


def _pattern(channels: int, height: int = HEIGHT, width: int = WIDTH) -> U8:
    """A smooth, asymmetric uint8 pattern (H, W, C) that JPEG keeps close."""
    y, x = np.mgrid[0:height, 0:width]
    planes = [x * 255 // (width - 1), y * 255 // (height - 1), (x + y) * 255 // (width + height)]
    return np.stack(planes[:channels], -1).astype(np.uint8)


def _sixteen_bit(path: Path) -> Path:
    values = (np.arange(HEIGHT * WIDTH, dtype=np.uint32).reshape(HEIGHT, WIDTH) * 170) % 65536
    Image.fromarray(values.astype(np.uint16)).save(path)
    return path


def _palette(path: Path) -> Path:
    image = Image.new("P", (WIDTH, HEIGHT), 0)
    image.putpalette([200, 10, 30, 5, 250, 60] + [0, 0, 0] * 254)
    image.paste(1, (0, 0, WIDTH // 2, HEIGHT))
    image.save(path, transparency=0)  # index 0 (the right half) transparent
    return path


def _cmyk(path: Path) -> Path:
    Image.new("CMYK", (WIDTH, HEIGHT), (0, 255, 255, 0)).save(path, quality=95)  # red
    return path


def _exif_rotated(path: Path) -> Path:
    # Stored as W=16, H=24; orientation 6 says: turn it 90 degrees clockwise to view.
    stored = Image.fromarray(_pattern(3, height=WIDTH, width=HEIGHT))
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(path, quality=95, exif=exif)
    return path


def _rgba(path: Path) -> Path:
    pixels = np.concatenate([_pattern(3), np.zeros((HEIGHT, WIDTH, 1), np.uint8)], -1)
    pixels[:, : WIDTH // 2, 3] = 255  # the right half fully transparent
    Image.fromarray(pixels, "RGBA").save(path)
    return path


def _la(path: Path) -> Path:
    gray = _pattern(1)[..., 0]
    Image.fromarray(np.stack([gray, np.full_like(gray, 7)], -1), "LA").save(path)
    return path


def _gray(path: Path) -> Path:
    Image.fromarray(_pattern(1)[..., 0], "L").save(path)
    return path


MAKERS = {
    "sixteen.png": _sixteen_bit,
    "palette.png": _palette,
    "cmyk.jpg": _cmyk,
    "rotated.jpg": _exif_rotated,
    "rgba.png": _rgba,
    "la.png": _la,
    "gray.png": _gray,
}


def _read(path: Path, channels: int = 3) -> U8:
    return read_image(path, channels, (HEIGHT, WIDTH))


def test_sixteen_bit_gray_is_scaled_not_clipped(tmp_path: Path) -> None:
    path = _sixteen_bit(tmp_path / "a.png")
    with Image.open(path) as image:
        assert image.mode == "I;16"
        stored = np.asarray(image).astype(np.int64)
    assert stored.max() > 255  # Pillow's own convert would clip all of these to 255
    assert np.array_equal(_read(path, 1)[0], stored >> 8)
    assert np.array_equal(_read(path, 3), np.repeat((stored >> 8)[None], 3, 0))


def test_palette_with_transparency_keeps_its_colours(tmp_path: Path) -> None:
    pixels = _read(_palette(tmp_path / "p.png"))
    assert pixels[:, 0, 0].tolist() == [5, 250, 60]  # index 1
    assert pixels[:, 0, -1].tolist() == [200, 10, 30]  # index 0: transparent, colour kept


def test_cmyk_jpeg_becomes_rgb(tmp_path: Path) -> None:
    path = _cmyk(tmp_path / "c.jpg")
    with Image.open(path) as image:
        assert image.mode == "CMYK"
    pixels = _read(path).astype(int)
    assert np.abs(pixels - np.array([255, 0, 0])[:, None, None]).max() <= 3


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    path = _exif_rotated(tmp_path / "r.jpg")
    with Image.open(path) as image:
        assert (image.height, image.width) == (WIDTH, HEIGHT)
        assert upright_size(image) == (HEIGHT, WIDTH)
        as_stored: U8 = np.asarray(image.convert("RGB"))
    pixels = _read(path)
    assert np.array_equal(pixels.transpose(1, 2, 0), np.rot90(as_stored, k=-1))
    assert not np.array_equal(pixels.transpose(1, 2, 0), np.rot90(as_stored, k=1))


def test_alpha_is_dropped_not_composited(tmp_path: Path) -> None:
    assert np.array_equal(_read(_rgba(tmp_path / "a.png")), _pattern(3).transpose(2, 0, 1))
    la = _read(_la(tmp_path / "la.png"), 1)
    assert np.array_equal(la[0], _pattern(1)[..., 0])
    assert np.array_equal(_read(tmp_path / "la.png"), np.repeat(la, 3, 0))


@pytest.mark.parametrize(
    ("mode", "values", "expected"),
    [
        ("F", np.array([[0.0, 0.5, 1.0]], np.float32), [0, 128, 255]),
        ("F", np.array([[0.0, 100.0, 300.0]], np.float32), [0, 100, 255]),
        ("I", np.array([[0, 100, 255]], np.int32), [0, 100, 255]),
        ("I", np.array([[0, 256, 65535]], np.int32), [0, 1, 255]),
        ("1", np.array([[False, True, True]]), [0, 255, 255]),
    ],
)
def test_wide_and_one_bit_gray_become_eight_bit(
    mode: str, values: npt.NDArray[np.generic], expected: list[int]
) -> None:
    image = Image.fromarray(values) if mode != "1" else Image.fromarray(values).convert("1")
    assert image.mode == mode
    result = normalised(image, 1)
    assert result.mode == "L"
    assert np.asarray(result)[0].tolist() == expected


def _write_modes(tree: Path) -> list[Path]:
    """Every file above twice, in train/<class>/ and test/<class>/ of an ImageFolder."""
    paths = []
    for split in ("train", "test"):
        for label, name in enumerate(("a", "b")):
            folder = tree / split / name
            folder.mkdir(parents=True)
            for file, make in list(MAKERS.items())[label::2]:
                paths.append(make(folder / file))
    return paths


def test_every_entry_point_decodes_a_file_alike(tmp_path: Path) -> None:
    _write_modes(tmp_path / "photos")
    spec: DatasetSpec = TypeAdapter(DatasetSpec).validate_python(
        {"name": "imagefolder", "path": "photos", "validation": 0}
    )
    in_memory = load_dataset(spec, data_root=tmp_path)
    files = load_dataset(spec.model_copy(update={"in_memory": False}), data_root=tmp_path)
    assert isinstance(in_memory.train, TensorSplit)
    assert isinstance(files.train, FileSplit)
    info = in_memory.info
    assert (info.channels, info.image_size) == (3, (HEIGHT, WIDTH))
    flat = info.__class__(info.name, info.classes, 3, info.image_size, (0.0,) * 3, (1.0,) * 3)
    batches = make_batches(
        files.train, flat, batch_size=len(files.train), device=torch.device("cpu"),
        augment=False, shuffle=False, drop_last=False, seed=0, num_workers=0,
    )  # fmt: skip
    ((streamed, _),) = list(batches.epoch(0))
    for row, path in enumerate(files.train.paths):
        expected = _read(path)
        with Image.open(path) as image:
            assert np.array_equal(decode(image, 3, (HEIGHT, WIDTH)), expected)
            assert np.array_equal(Preprocessing.of(info).image(image), expected)
        assert np.array_equal(in_memory.train.images[row].numpy(), expected), path.name
        pipeline = (streamed[row] * 255).round().to(torch.uint8).numpy()
        assert np.array_equal(pipeline, expected), path.name
