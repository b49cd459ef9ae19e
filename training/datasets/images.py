"""Image files: which names count as images, and decoding one with Pillow."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif"})
# Pillow modes without colour; a dataset made only of these is read as one channel.
GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F"})


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
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ValueError(f"cannot read image {path}: {error}") from error


def normalised(image: Image.Image, channels: int) -> Image.Image:
    """An open image upright (its EXIF orientation applied) in 8-bit "RGB" or "L"."""
    image = ImageOps.exif_transpose(image) or image
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # Pillow's convert clips 16-bit values at 255: scale the range to 8 bits instead.
        values = np.asarray(image, dtype=np.uint32)
        shift = 8 if image.mode != "I" or values.max(initial=0) > 255 else 0
        image = Image.fromarray((values >> shift).clip(0, 255).astype(np.uint8), "L")
    return image.convert("L" if channels == 1 else "RGB")


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
