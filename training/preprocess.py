"""The one preprocessing of a trained net, declared once and applied by every path.

A checkpoint carries a `Preprocessing` record, as torchvision's weights carry their
transforms: how an image of any size becomes the net's input (resize, centre crop,
interpolation, channels) and how it is normalised (mean, std). Training's evaluation,
evaluate jobs, batch predictions, `/api/v1/predict` and `/v2` all turn an image into input
through `Preprocessing.image`, so one photo gets the same probabilities in each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from training.data import DatasetInfo
from training.datasets.images import normalised
from training.specs import DatasetSpec, ImageFolderSpec

Interpolation = Literal["bilinear", "bicubic", "nearest"]
INTERPOLATIONS: tuple[Interpolation, ...] = get_args(Interpolation)
_MODES = {
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
    "nearest": InterpolationMode.NEAREST,
}


@dataclass(frozen=True)
class Preprocessing:
    """How an image becomes the net's input.

    `resize` is the shorter side the image is resized to (aspect kept) before the centre
    `crop` (height, width) is taken, as torchvision's `Resize(256)` + `CenterCrop(224)`;
    None resizes the whole image to `crop` exactly (the aspect is not kept). `mean` and
    `std` are per channel on the [0, 1] scale.
    """

    crop: tuple[int, int]
    resize: int | None
    interpolation: Interpolation
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation {self.interpolation!r} is unknown; use one of {INTERPOLATIONS}"
            )
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {self.channels}")
        if not len(self.mean) == len(self.std) == self.channels:
            raise ValueError("mean and std need one value per channel")
        if min(self.crop) < 1 or (self.resize is not None and self.resize < 1):
            raise ValueError("crop and resize must be positive sizes")

    def to_record(self) -> dict[str, Any]:
        """A plain dict for checkpoints (loadable with `weights_only=True`) and JSON."""
        return {
            "crop": list(self.crop),
            "resize": self.resize,
            "interpolation": self.interpolation,
            "channels": self.channels,
            "mean": list(self.mean),
            "std": list(self.std),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Preprocessing:
        """The `Preprocessing` that `to_record` wrote."""
        height, width = record["crop"]
        return cls(
            crop=(int(height), int(width)),
            resize=None if record["resize"] is None else int(record["resize"]),
            interpolation=record["interpolation"],
            channels=int(record["channels"]),
            mean=tuple(float(m) for m in record["mean"]),
            std=tuple(float(s) for s in record["std"]),
        )

    @classmethod
    def of(cls, info: DatasetInfo, *, resize: int | None = None) -> Preprocessing:
        """A dataset's preprocessing: its input size and statistics; the shorter side to
        `resize` (default: the input's shorter side, so no image is stretched)."""
        return cls(
            crop=info.image_size,
            resize=resize or min(info.image_size),
            interpolation="bilinear",
            channels=info.channels,
            mean=info.mean,
            std=info.std,
        )

    @classmethod
    def for_decoding(
        cls, crop: tuple[int, int], resize: int | None, channels: int
    ) -> Preprocessing:
        """The geometry a dataset's images are decoded to (the shorter side to `resize`,
        default the input's, then the centre crop), with neutral statistics: decoding does
        not normalise."""
        return cls(
            crop=crop,
            resize=resize or min(crop),
            interpolation="bilinear",
            channels=channels,
            mean=(0.0,) * channels,
            std=(1.0,) * channels,
        )

    @property
    def mode(self) -> InterpolationMode:
        """The interpolation as torchvision names it."""
        return _MODES[self.interpolation]

    def geometry(self, image: Image.Image) -> Image.Image:
        """The image resized and centre-cropped to the input (its mode already normalised)."""
        height, width = self.crop
        if self.resize is None:
            return (
                image
                if image.size == (width, height)
                else image.resize((width, height), _pillow_filter(self.interpolation))
            )
        if min(image.size) != self.resize:
            image = TF.resize(image, [self.resize], interpolation=self.mode, antialias=True)
        if image.size != (width, height):
            image = TF.center_crop(image, [height, width])
        return image

    def image(self, image: Image.Image) -> npt.NDArray[np.uint8]:
        """An open image of any size and mode as the net's uint8 (C, H, W) input."""
        fitted = self.geometry(normalised(image, self.channels))
        array = np.array(fitted, dtype=np.uint8)  # a copy of its own: writable for torch
        return np.ascontiguousarray(array[None] if self.channels == 1 else array.transpose(2, 0, 1))

    def describe(self, image: Image.Image) -> str:
        """What `image` does to this image: "none", "resize" or "resize+center-crop"."""
        height, width = self.crop
        if image.size == (width, height):
            return "none"
        if self.resize is None or image.width * height == image.height * width:
            return "resize"
        return "resize+center-crop"


def _pillow_filter(name: Interpolation) -> Image.Resampling:
    """Pillow's resampling filter of an interpolation name."""
    return {
        "bilinear": Image.Resampling.BILINEAR,
        "bicubic": Image.Resampling.BICUBIC,
        "nearest": Image.Resampling.NEAREST,
    }[name]


def preprocessing_for(dataset: DatasetSpec, info: DatasetInfo) -> Preprocessing:
    """The preprocessing a run on `dataset` declares: its input size and statistics, the
    shorter side resized to the dataset's `resize` where it has one, else to the input."""
    resize = dataset.resize if isinstance(dataset, ImageFolderSpec) else None
    return Preprocessing.of(info, resize=resize)


def preprocessing_of(saved: dict[str, Any]) -> Preprocessing:
    """A checkpoint's declared preprocessing; one written before checkpoints declared it
    gets what serving did then: the shorter side to the input, and a centre crop."""
    if record := saved.get("preprocessing"):
        return Preprocessing.from_record(record)
    return Preprocessing.of(DatasetInfo.from_record(saved["data"]))
