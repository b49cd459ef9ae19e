"""Encoded image files as a prediction receives them: checked, decoded and fitted.

A request's files have their sizes and headers checked by `opened_all` before any model
is loaded (a request of bad files starts no model), then are decoded and fitted to the
model's input by `fitted_all`: on the event loop when they are small, in a worker thread
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

import numpy as np
from PIL import Image
from starlette.concurrency import run_in_threadpool

from core.settings import Settings
from serving.errors import (
    BadInputError,
    InputTooLargeError,
    Location,
    ServingError,
    UnsupportedInputError,
)
from training.predictor import (
    ImageRejectedError,
    ImageTooLargeError,
    UndecodableImageError,
    UnsupportedImageError,
    fit_to,
    load_checked,
    open_checked,
)
from training.preprocess import Preprocessing

FILE_ERRORS: dict[type[ImageRejectedError], type[ServingError]] = {
    UndecodableImageError: BadInputError,
    ImageTooLargeError: InputTooLargeError,
    UnsupportedImageError: UnsupportedInputError,
}

# A request whose files are this small is checked and decoded on the event loop (a 32x32
# PNG takes about 35 us), which saves a thread hop; larger ones go to a worker thread.
INLINE_BYTES = 64 * 1024
INLINE_PIXELS = 256 * 256


@dataclass(slots=True)
class Upload:
    """An uploaded file: its name, its bytes (or a file to read them from, not read when
    its size is over the limit) and its size."""

    name: str
    data: bytes | IO[bytes]
    size: int


@dataclass(slots=True)
class Checked:
    """One uploaded file after checking: its model input, or why it has none."""

    name: str
    array: np.ndarray | None = None
    resize: str | None = None
    error: ImageRejectedError | None = None


Opened = tuple[Checked, Image.Image | None]


async def opened_all(settings: Settings, files: list[Upload]) -> list[Opened]:
    """Every file's size and header checked (nothing decoded yet), or its error."""
    if any(upload.size > INLINE_BYTES for upload in files):
        return await run_in_threadpool(_opened_each, settings, files)
    return _opened_each(settings, files)


def _opened_each(settings: Settings, files: list[Upload]) -> list[Opened]:
    return [opened(settings, upload) for upload in files]


def opened(settings: Settings, upload: Upload) -> Opened:
    """A file with its header checked (not yet decoded), or with its error."""
    name, limit = upload.name, settings.predict_max_image_bytes
    if upload.size > limit:  # refused without reading it
        message = f"{name}: {upload.size:,} bytes is over the limit of {limit:,} per image"
        return Checked(name, error=ImageTooLargeError(message)), None
    data = upload.data if isinstance(upload.data, bytes) else upload.data.read()
    try:
        image = open_checked(data, name, max_pixels=settings.predict_max_pixels, load=False)
    except ImageRejectedError as error:
        return Checked(name, error=error), None
    return Checked(name), image


async def fitted_all(preprocessing: Preprocessing, files: list[Opened]) -> list[Checked]:
    """Every checked file decoded and fitted to the model's input: small ones inline."""
    pixels = sum(image.width * image.height for _, image in files if image is not None)
    if pixels > INLINE_PIXELS:
        return await run_in_threadpool(_fitted_each, preprocessing, files)
    return _fitted_each(preprocessing, files)


def _fitted_each(preprocessing: Preprocessing, files: list[Opened]) -> list[Checked]:
    return [fitted(preprocessing, file, image) for file, image in files]


def fitted(preprocessing: Preprocessing, file: Checked, image: Image.Image | None) -> Checked:
    """A checked file decoded and fitted to the model's input, or its error."""
    if image is None:
        return file
    name = file.name
    try:
        array, resize = fit_to(load_checked(image, name), preprocessing)
    except ImageRejectedError as error:
        return Checked(name, error=error)
    except (OSError, ValueError) as error:  # decodable header, undecodable pixel data
        return Checked(name, error=UndecodableImageError(f"{name}: cannot be decoded ({error})"))
    return Checked(name, array=array, resize=resize)


def all_failed(files: list[Checked], where: Location = ("body", "files")) -> ServingError:
    """The whole request's error when it cannot be answered for its files: the first bad
    file's status, and a message naming each bad file."""
    failed = [(index, file.error) for index, file in enumerate(files) if file.error]
    first = failed[0][1]
    details: list[tuple[Location, str]] = [((*where, i), str(e)) for i, e in failed]
    message = "no file could be classified: " + "; ".join(str(e) for _, e in failed)
    return FILE_ERRORS[type(first)](message, details=details)
