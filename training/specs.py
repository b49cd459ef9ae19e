"""What a run is: model, dataset and recipe, as closed pydantic models.

The service's job spec reuses these; unknown fields and out-of-range values are rejected
with a message per field. Defaults are the papers' CIFAR recipe (shared/PAPERS.md).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import models


class Spec(BaseModel):
    """Base of every spec: closed (unknown fields are errors) and immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(Spec):
    """A zoo name and its options, checked against the registry."""

    name: str = Field(examples=["resnet20"])
    options: dict[str, Any] = Field(default_factory=dict, examples=[{"shortcut": "B"}])

    @model_validator(mode="after")
    def _resolves(self) -> ModelSpec:
        try:
            models.resolve(self.name, **self.options)
        except ValueError as error:
            raise ValueError(str(error)) from None
        return self


class _DatasetBase(Spec):
    validation: float = Field(
        0.1, ge=0, le=0.5, description="Seeded hold-out fraction of the training split."
    )
    split_seed: int = Field(0, ge=0, description="Seed of the validation (and test) split.")
    split: Literal["train", "val", "test"] = Field(
        "test", description="The split an evaluation job reads."
    )
    train_limit: int | None = Field(
        None, ge=1, description="Use only the first N training images (after the split)."
    )


class Cifar10Spec(_DatasetBase):
    """CIFAR-10 python archive (`cifar-10-python.tar.gz` or its unpacked folder)."""

    name: Literal["cifar10"]


class Cifar100Spec(_DatasetBase):
    """CIFAR-100 python archive (`cifar-100-python.tar.gz` or its unpacked folder)."""

    name: Literal["cifar100"]


class MnistSpec(_DatasetBase):
    """MNIST IDX files, gzipped or not, in torchvision's layout or a plain folder."""

    name: Literal["mnist"]


class FashionMnistSpec(_DatasetBase):
    """Fashion-MNIST IDX files, gzipped or not, in torchvision's layout or a plain folder."""

    name: Literal["fashion_mnist"]


class DigitsSpec(_DatasetBase):
    """scikit-learn's 8x8 optical digits, always available offline."""

    name: Literal["digits"]
    test_fraction: float = Field(0.2, gt=0, lt=1, description="Seeded test hold-out.")


class ImageFolderSpec(_DatasetBase):
    """A `class/image` tree, or a .zip/.tar/.tar.gz of one, under the data root."""

    name: Literal["imagefolder"]
    path: str = Field(description="Folder or archive, relative to the data root.")
    image_size: int | None = Field(
        None, ge=8, le=1024, description="Resize to this square size; default: the first image's."
    )
    test_fraction: float = Field(
        0.2, gt=0, lt=1, description="Seeded test hold-out when there is no test/ subtree."
    )
    in_memory: bool | None = Field(
        None, description="Hold decoded images in memory; default: when they fit."
    )

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.replace("\\", "/").split("/"):
            raise ValueError("path must be relative to the data root, without '..'")
        return value


class SyntheticSpec(_DatasetBase):
    """Seeded noise with random labels: for smoke tests only."""

    name: Literal["synthetic"]
    num_classes: int = Field(10, ge=2, le=1000)
    image_size: int = Field(32, ge=8, le=256)
    channels: Literal[1, 3] = 3
    train_size: int = Field(512, ge=2, le=100_000)
    test_size: int = Field(128, ge=1, le=100_000)


DatasetSpec = Annotated[
    Cifar10Spec
    | Cifar100Spec
    | MnistSpec
    | FashionMnistSpec
    | DigitsSpec
    | ImageFolderSpec
    | SyntheticSpec,
    Field(discriminator="name"),
]
