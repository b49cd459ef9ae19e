"""Dataset readers: CIFAR-10/100, MNIST, Fashion-MNIST, digits, ImageFolder and synthetic.

`load_dataset(spec, data_root=...)` returns a `LoadedDataset` (training.data) with seeded
train / validation / test splits and the training split's per-channel statistics.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict, assert_never

from training.data import LoadedDataset
from training.datasets import cifar, generated, idx, imagefolder
from training.datasets.archives import unpack_archive
from training.datasets.common import DatasetNotFound, assemble
from training.datasets.idx import read_idx
from training.datasets.images import read_image
from training.specs import (
    Cifar10Spec,
    Cifar100Spec,
    DatasetSpec,
    DigitsSpec,
    FashionMnistSpec,
    ImageFolderSpec,
    MnistSpec,
    SyntheticSpec,
)

__all__ = [
    "DatasetAvailability",
    "DatasetNotFound",
    "available_datasets",
    "load_dataset",
    "read_idx",
    "read_image",
    "unpack_archive",
]


class DatasetAvailability(TypedDict):
    """Whether a dataset can be read here, where from, and what it needs otherwise."""

    name: str
    available: bool
    downloadable: bool
    location: str | None
    needs: str


def load_dataset(spec: DatasetSpec, *, data_root: Path, download: bool = False) -> LoadedDataset:
    """Read the dataset `spec` names from `data_root`, with its splits and statistics."""
    match spec:
        case Cifar10Spec() | Cifar100Spec():
            parts = cifar.load(spec.name, data_root, download=download)
        case MnistSpec() | FashionMnistSpec():
            parts = idx.load(spec.name, data_root, download=download)
        case DigitsSpec():
            parts = generated.digits(spec)
        case SyntheticSpec():
            parts = generated.synthetic(spec)
        case ImageFolderSpec():
            parts = imagefolder.load(spec, data_root)
        case _:
            assert_never(spec)
    return assemble(parts, spec)


def _on_disk(name: str, location: Path | None, needs: str) -> DatasetAvailability:
    """The availability of a dataset that is read from files torchvision can download."""
    where = None if location is None else str(location)
    return DatasetAvailability(
        name=name, available=where is not None, downloadable=True, location=where, needs=needs
    )


def available_datasets(data_root: Path) -> list[DatasetAvailability]:
    """Every dataset name, whether it can be read here (file existence only), and its needs."""
    on_disk = {name: (cifar.locate, cifar.hint) for name in cifar.FORMATS}
    on_disk |= {name: (idx.locate, idx.hint) for name in idx.FOLDERS}
    found = [
        _on_disk(name, locate(name, data_root), f"{hint(name, data_root)}, or enable downloads")
        for name, (locate, hint) in on_disk.items()
    ]
    always = {
        "digits": "nothing (ships with scikit-learn)",
        "imagefolder": f"a class/image folder or .zip/.tar/.tar.gz archive under {data_root}",
        "synthetic": "nothing (generated)",
    }
    return found + [
        DatasetAvailability(
            name=name, available=True, downloadable=False, location=None, needs=needs
        )
        for name, needs in always.items()
    ]
