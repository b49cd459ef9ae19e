"""The data an evaluation or a batch prediction reads: an ImageFolder from its files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from training.data import LoadedDataset, Split
from training.datasets import load_dataset
from training.specs import DatasetSpec, ImageFolderSpec


def load_for_reading(
    dataset: DatasetSpec,
    *,
    data_root: Path,
    download: bool = False,
    prepare: Callable[[LoadedDataset], None] | None = None,
) -> LoadedDataset:
    """`dataset`, an ImageFolder read from its files (its photos become input exactly as
    `/predict` makes them, whatever their number); `prepare` sees it once loaded."""
    if isinstance(dataset, ImageFolderSpec):
        dataset = dataset.model_copy(update={"in_memory": False})
    data = load_dataset(dataset, data_root=data_root, download=download)
    if prepare is not None:  # the service records the data read
        prepare(data)
    return data


def nonempty_split(data: LoadedDataset, name: str) -> Split:
    """The split `name` of `data`; a `ValueError` when it holds no image."""
    split = data.split(name)
    if len(split) == 0:
        raise ValueError(f"the {name} split of {data.info.name} is empty")
    return split
