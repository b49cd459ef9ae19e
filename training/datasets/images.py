"""Image files: which names count as images, and decoding one with Pillow.

Every path that turns an image into pixels (the in-memory loader, the file DataLoader,
batch prediction and serving) goes through `normalised`, so one file gives one array.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif"})
# Pillow modes without colour; a dataset made only of these is read as one channel.
GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
# What Pillow raises for a file it cannot identify, a truncated or corrupt stream, or a bomb.
DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
_SIXTEEN_BIT = frozenset({"I;16", "I;16B", "I;16L", "I;16N"})
# Alpha is dropped, not composited: torchvision's ImageFolder loader (`convert("RGB")`) and
# `torchvision.io.decode_image(mode=ImageReadMode.RGB)` both drop it, so a net trained or
# pretrained with torchvision sees the same pixels here; a background would be invented.
_WITH_ALPHA = {"LA": "L", "RGBA": "RGB", "PA": "RGB"}
# EXIF orientations (tag 0x0112) that turn the image a quarter: its sides swap.
_QUARTER_TURNS = frozenset({5, 6, 7, 8})


def is_image_name(name: str) -> bool:
    """Whether a file name has an image extension and is not hidden (e.g. macOS `._x.png`)."""
    path = Path(name)
    return path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith(".")


@contextmanager
def open_image(path: Path) -> Iterator[Image.Image]:
    """Open an image with Pillow, turning any decoding failure into an error naming the file."""
    try:
        with Image.open(path) as image:
            yield image
    except DECODE_ERRORS as error:
        raise ValueError(f"cannot read image {path}: {error}") from error


def upright_size(image: Image.Image) -> tuple[int, int]:
    """The (height, width) an open image has once its EXIF orientation is applied."""
    turned = image.getexif().get(0x0112) in _QUARTER_TURNS
    return (image.width, image.height) if turned else (image.height, image.width)


def _eight_bit(image: Image.Image) -> Image.Image:
    """Gray images of 16 or 32 bits, or floats, scaled to 8-bit "L" (Pillow would clip them)."""
    if image.mode in _SIXTEEN_BIT:
        values = np.asarray(image).astype(np.uint16) >> 8
    elif image.mode == "I":
        # 32-bit integers: 8-bit or 16-bit data in disguise, as their range tells.
        wide = np.asarray(image, dtype=np.int64).clip(0, 2**32 - 1)
        peak = int(wide.max(initial=0))
        values = wide >> (0 if peak < 2**8 else 8 if peak < 2**16 else 24)
    elif image.mode == "F":
        # Floats on [0, 1] (the usual scientific convention), else on the 0-255 scale.
        floats = np.nan_to_num(np.asarray(image, dtype=np.float64))
        values = np.rint(floats * 255 if floats.max(initial=0) <= 1 else floats)
    else:
        return image
    return Image.fromarray(values.clip(0, 255).astype(np.uint8), "L")


def normalised(image: Image.Image, channels: int) -> Image.Image:
    """An open image upright (its EXIF orientation applied) in 8-bit "RGB" (3) or "L" (1).

    Palette, CMYK, 16-bit and float gray, 1-bit and alpha images all arrive here; alpha
    (and a palette's transparency) is dropped.
    """
    image = ImageOps.exif_transpose(image) or image
    image = _eight_bit(image)
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in _WITH_ALPHA:
        image = image.convert(_WITH_ALPHA[image.mode])
    target = "L" if channels == 1 else "RGB"
    return image if image.mode == target else image.convert(target)


def decode(image: Image.Image, channels: int, size: tuple[int, int]) -> npt.NDArray[np.uint8]:
    """An open image as uint8 (C, H, W): upright, in RGB or L and resized to (H, W)."""
    image = normalised(image, channels)
    height, width = size
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.BILINEAR)
    array = np.array(image, dtype=np.uint8)
    return array[None] if channels == 1 else array.transpose(2, 0, 1)


def read_image(path: Path, channels: int, size: tuple[int, int]) -> npt.NDArray[np.uint8]:
    """Decode an image file to uint8 (C, H, W) as a dataset with `channels` and `size` holds it."""
    with open_image(path) as image:
        return decode(image, channels, size)
